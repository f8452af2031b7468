// distributed/mesh.h -- the dp x cp x tp x pp layout of the ranks, validated once, with its groups.
//
// world = dp * cp * tp * pp. Rank layout, tp fastest (tensor-parallel peers share a node, as in
// Megatron), then cp (context parallelism: the ranks that split each sequence), then dp, then pp:
//   rank = ((pp_index * dp + dp_index) * cp + cp_index) * tp + tp_index
// (cp = 1: rank = (pp_index * dp + dp_index) * tp + tp_index). The mesh holds one Communicator per
// axis for this rank (the ranks that differ only in that axis' index: the world itself where an
// axis spans it, a local group of one where it is 1 -- no backend communicator for either) and, with cp > 1, the
// dp x cp group that reduces gradients (cp ranks see different tokens of the same samples, so
// every parameter's gradient is a sum over both axes; Megatron's "dp-cp" group). It is passed
// explicitly to whoever needs a group: there is no global process-group state.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "distributed/comm.h"

namespace kiln {

struct MeshShape {
  int dp = 1, tp = 1, pp = 1, cp = 1;
  int ep = 1;  // expert parallelism: groups of ep consecutive dp ranks (parallel/expert_parallel.h); divides dp
  // dp = world / (cp * tp * pp). Throws ConfigError listing every factor when it does not divide.
  static MeshShape resolve(int world, int tp, int pp, int cp = 1);
  // The ranks a gradient is reduced over: dp x cp.
  int grad_ranks() const { return dp * cp; }
};

struct MeshCoord {
  int dp = 0, tp = 0, pp = 0, cp = 0;
};

// The coordinates of `rank` in `shape` (pure arithmetic, for tests and messages).
MeshCoord coord_of(int rank, const MeshShape& shape);

class Mesh {
 public:
  // Splits `world` into the axis groups (collective over world).
  Mesh(std::shared_ptr<Communicator> world, MeshShape shape);
  const MeshShape& shape() const { return shape_; }
  const MeshCoord& coord() const { return coord_; }
  const std::shared_ptr<Communicator>& world() const { return world_; }
  const std::shared_ptr<Communicator>& dp() const { return dp_; }
  const std::shared_ptr<Communicator>& tp() const { return tp_; }
  const std::shared_ptr<Communicator>& pp() const { return pp_; }
  // cp > 1 only (null otherwise).
  const std::shared_ptr<Communicator>& cp() const { return cp_; }
  // The gradient-reduction group: dp x cp, ordered by (dp, cp) index; dp itself when cp = 1.
  const std::shared_ptr<Communicator>& dp_cp() const { return cp_ ? dp_cp_ : dp_; }
  // ep > 1 only (null otherwise): this rank's expert-parallel group (dp ranks [g ep, (g + 1) ep)
  // with g = dp / ep, ordered by dp) and its expert-data-parallel group (the dp ranks with the
  // same dp % ep, and under cp each of their cp ranks, ordered by (dp, cp): the copies of this
  // rank's experts, dp / ep x cp of them).
  const std::shared_ptr<Communicator>& ep() const { return ep_; }
  const std::shared_ptr<Communicator>& expert_dp() const { return edp_; }
  // comm_bytes of every group this rank belongs to, each counted once.
  int64_t bytes_sent() const;
  // Of those, the expert-parallel group's (its all-to-alls and the norm's expert part; 0 without ep).
  int64_t ep_bytes_sent() const;
  // The distinct communicators of the mesh (an axis spanning the world is the world).
  std::vector<const Communicator*> groups() const;

 private:
  std::shared_ptr<Communicator> world_, dp_, tp_, pp_, cp_, dp_cp_, ep_, edp_;
  MeshShape shape_;
  MeshCoord coord_;
};

}  // namespace kiln
