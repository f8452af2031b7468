// distributed/mesh.cpp -- layout validation and the axis groups.
#include "distributed/mesh.h"

#include <algorithm>

#include "distributed/comm_self.h"
#include "distributed/error.h"

namespace kiln {

MeshShape MeshShape::resolve(int world, int tp, int pp, int cp) {
  if (tp < 1 || pp < 1 || cp < 1 || world < 1 || world % (tp * pp * cp) != 0) {
    const std::string cp_part = cp > 1 ? " x cp " + std::to_string(cp) : "";
    throw ConfigError("layout does not divide the world: world " + std::to_string(world) + " ranks, tp " +
                      std::to_string(tp) + " x pp " + std::to_string(pp) + cp_part + " = " + std::to_string(tp * pp * cp) +
                      " (dp = world / (tp x pp" + (cp > 1 ? " x cp" : "") + ") must be a whole number)");
  }
  return MeshShape{world / (tp * pp * cp), tp, pp, cp};
}

MeshCoord coord_of(int rank, const MeshShape& s) {
  MeshCoord c;
  c.tp = rank % s.tp;
  c.cp = (rank / s.tp) % s.cp;
  c.dp = (rank / (s.tp * s.cp)) % s.dp;
  c.pp = rank / (s.tp * s.cp * s.dp);
  return c;
}

Mesh::Mesh(std::shared_ptr<Communicator> world, MeshShape shape) : world_(std::move(world)), shape_(shape) {
  const int r = world_->rank();
  if (world_->size() != shape.dp * shape.cp * shape.tp * shape.pp) {
    throw ConfigError("mesh dp " + std::to_string(shape.dp) + " x cp " + std::to_string(shape.cp) + " x tp " +
                      std::to_string(shape.tp) + " x pp " + std::to_string(shape.pp) + " does not match the world of " +
                      std::to_string(world_->size()));
  }
  coord_ = coord_of(r, shape);
  const MeshCoord& c = coord_;
  // A group is the ranks whose other coordinates agree: those make the split color. Every rank
  // makes every split (MPI_Comm_split is collective over world), in the same order. A group of
  // the whole world is the world itself (its key is the world rank: same members, same order); a
  // group of one is local (distributed/comm_self.h). Neither makes a communicator: with NCCL each
  // has its own buffers, proxy thread and stream (pure data parallelism had four).
  auto group = [&](int size, int color, int key, const char* name) -> std::shared_ptr<Communicator> {
    if (size == 1) return make_self_communicator(name, world_->backend());
    if (size == world_->size()) return world_;
    return world_->split(color, key, name);
  };
  dp_ = group(shape.dp, (c.pp * shape.cp + c.cp) * shape.tp + c.tp, c.dp, "dp");
  tp_ = group(shape.tp, (c.pp * shape.dp + c.dp) * shape.cp + c.cp, c.tp, "tp");
  pp_ = group(shape.pp, (c.dp * shape.cp + c.cp) * shape.tp + c.tp, c.pp, "pp");
  if (shape.cp > 1) {
    cp_ = group(shape.cp, (c.pp * shape.dp + c.dp) * shape.tp + c.tp, c.cp, "cp");
    dp_cp_ = group(shape.dp * shape.cp, c.pp * shape.tp + c.tp, c.dp * shape.cp + c.cp, "dp_cp");
  }
  if (shape.ep > 1) {
    if (shape.dp % shape.ep != 0) {
      throw ConfigError("--ep " + std::to_string(shape.ep) + " must divide the data-parallel size (dp " + std::to_string(shape.dp) +
                        "): the expert-parallel groups are carved out of dp");
    }
    // Communicators of their own even where dp's members would do: ep_bytes_sent is ep's count.
    ep_ = dp_->split(c.dp / shape.ep, c.dp % shape.ep, "ep");
    // The copies of this rank's experts: the dp ranks with the same dp % ep -- and under cp
    // every cp rank of those (they hold the same experts and see other tokens of the samples).
    const int copies = shape.dp / shape.ep * shape.cp;
    if (copies == 1) edp_ = make_self_communicator("expert_dp", world_->backend());
    else if (shape.cp == 1) edp_ = dp_->split(c.dp % shape.ep, c.dp / shape.ep, "expert_dp");
    else edp_ = dp_cp_->split(c.dp % shape.ep, c.dp / shape.ep * shape.cp + c.cp, "expert_dp");
  }
}

int64_t Mesh::ep_bytes_sent() const { return ep_ ? ep_->stats().bytes : 0; }

int64_t Mesh::bytes_sent() const {
  int64_t b = 0;
  for (const Communicator* g : groups()) b += g->stats().bytes;
  return b;
}

std::vector<const Communicator*> Mesh::groups() const {
  std::vector<const Communicator*> out;
  for (const auto* g : {&world_, &dp_, &tp_, &pp_, &cp_, &dp_cp_, &ep_, &edp_})
    if (*g && std::find(out.begin(), out.end(), g->get()) == out.end()) out.push_back(g->get());
  return out;
}

}  // namespace kiln
