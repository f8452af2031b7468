// kernels/rope_math.cuh -- a rotary pair turned by its angle, on the host and the device
// (kernels/hd.cuh). models/rotary.h's rule, x * cos + rotate_half(x) * sin with
// rotate_half([x1, x2]) = [-x2, x1], pairs x1 = x[i] with x2 = x[i + h/2] at one angle:
//   forward   y1 = x1 c - x2 s,   y2 = x2 c + x1 s
//   backward  the transpose, a turn by -angle: dx1 = dy1 c + dy2 s,  dx2 = dy2 c - dy1 s
// in fp32, each output rounded once (the composite path rounds after each of its five ops).
#pragma once

#include "kernels/hd.cuh"

namespace kiln::kernels {

KILN_HD void rope_turn(float x1, float x2, float c, float s, float& y1, float& y2) {
  y1 = x1 * c - x2 * s;
  y2 = x2 * c + x1 * s;
}

}  // namespace kiln::kernels
