// runtime/mesh.h -- the dp x tp x pp layout of the ranks, validated once, with its groups.
//
// world = dp * tp * pp. Rank layout, tp fastest (tensor-parallel peers share a node, as in
// Megatron), then dp, then pp:
//   rank = (pp_index * dp + dp_index) * tp + tp_index
// The mesh owns one Communicator per axis for this rank (the ranks that differ only in that
// axis' index) and is passed explicitly to whoever needs a group: there is no global
// process-group state.
#pragma once

#include <memory>
#include <string>

#include "runtime/comm.h"

namespace kiln {

struct MeshShape {
  int dp = 1, tp = 1, pp = 1;
  // dp = world / (tp * pp). Throws ConfigError listing every factor when it does not divide.
  static MeshShape resolve(int world, int tp, int pp);
};

struct MeshCoord {
  int dp = 0, tp = 0, pp = 0;
};

// The coordinates of `rank` in `shape` (pure arithmetic, for tests and messages).
MeshCoord coord_of(int rank, const MeshShape& shape);

class Mesh {
 public:
  // Splits `world` into the three axis groups (collective over world).
  Mesh(std::shared_ptr<Communicator> world, MeshShape shape);
  const MeshShape& shape() const { return shape_; }
  const MeshCoord& coord() const { return coord_; }
  const std::shared_ptr<Communicator>& world() const { return world_; }
  const std::shared_ptr<Communicator>& dp() const { return dp_; }
  const std::shared_ptr<Communicator>& tp() const { return tp_; }
  const std::shared_ptr<Communicator>& pp() const { return pp_; }

 private:
  std::shared_ptr<Communicator> world_, dp_, tp_, pp_;
  MeshShape shape_;
  MeshCoord coord_;
};

}  // namespace kiln
