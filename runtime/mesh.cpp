// runtime/mesh.cpp -- layout validation and the axis groups.
#include "runtime/mesh.h"

#include "runtime/error.h"

namespace kiln {

MeshShape MeshShape::resolve(int world, int tp, int pp) {
  if (tp < 1 || pp < 1 || world < 1 || world % (tp * pp) != 0) {
    throw ConfigError("layout does not divide the world: world " + std::to_string(world) + " ranks, tp " +
                      std::to_string(tp) + " x pp " + std::to_string(pp) + " = " + std::to_string(tp * pp) +
                      " (dp = world / (tp x pp) must be a whole number)");
  }
  return MeshShape{world / (tp * pp), tp, pp};
}

MeshCoord coord_of(int rank, const MeshShape& s) {
  return MeshCoord{(rank / s.tp) % s.dp, rank % s.tp, rank / (s.tp * s.dp)};
}

Mesh::Mesh(std::shared_ptr<Communicator> world, MeshShape shape) : world_(std::move(world)), shape_(shape) {
  const int r = world_->rank();
  if (world_->size() != shape.dp * shape.tp * shape.pp) {
    throw ConfigError("mesh dp " + std::to_string(shape.dp) + " x tp " + std::to_string(shape.tp) + " x pp " +
                      std::to_string(shape.pp) + " does not match the world of " + std::to_string(world_->size()));
  }
  coord_ = coord_of(r, shape);
  // A group is the ranks whose other two coordinates agree: that pair is the split color.
  dp_ = world_->split(coord_.pp * shape.tp + coord_.tp, coord_.dp, "dp");
  tp_ = world_->split(coord_.pp * shape.dp + coord_.dp, coord_.tp, "tp");
  pp_ = world_->split(coord_.dp * shape.tp + coord_.tp, coord_.pp, "pp");
}

}  // namespace kiln
