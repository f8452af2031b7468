// distributed/mesh.cpp -- layout validation and the axis groups.
#include "distributed/mesh.h"

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
  // makes every split (MPI_Comm_split is collective over world), in the same order.
  dp_ = world_->split((c.pp * shape.cp + c.cp) * shape.tp + c.tp, c.dp, "dp");
  tp_ = world_->split((c.pp * shape.dp + c.dp) * shape.cp + c.cp, c.tp, "tp");
  pp_ = world_->split((c.dp * shape.cp + c.cp) * shape.tp + c.tp, c.pp, "pp");
  if (shape.cp > 1) {
    cp_ = world_->split((c.pp * shape.dp + c.dp) * shape.tp + c.tp, c.cp, "cp");
    dp_cp_ = world_->split(c.pp * shape.tp + c.tp, c.dp * shape.cp + c.cp, "dp_cp");
  }
  if (shape.ep > 1) {
    if (shape.dp % shape.ep != 0) {
      throw ConfigError("--ep " + std::to_string(shape.ep) + " must divide the data-parallel size (dp " + std::to_string(shape.dp) +
                        "): the expert-parallel groups are carved out of dp");
    }
    ep_ = dp_->split(c.dp / shape.ep, c.dp % shape.ep, "ep");
    edp_ = dp_->split(c.dp % shape.ep, c.dp / shape.ep, "expert_dp");
  }
}

int64_t Mesh::ep_bytes_sent() const { return ep_ ? ep_->stats().bytes : 0; }

int64_t Mesh::bytes_sent() const {
  int64_t b = world_->stats().bytes + dp_->stats().bytes + tp_->stats().bytes + pp_->stats().bytes;
  if (cp_) b += cp_->stats().bytes + dp_cp_->stats().bytes;
  if (ep_) b += ep_->stats().bytes + edp_->stats().bytes;
  return b;
}

}  // namespace kiln
