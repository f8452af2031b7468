// kernels/matmul.h -- the matrix products of kiln's layers: LibTorch's, except 16-bit operands
// on the CPU, which are multiplied by the fp32 GEMM.
//
// A 16-bit product (bf16 or fp16 operands) is, on every device kiln runs, the exact products of
// the 16-bit values accumulated in fp32 and rounded once to 16 bits: a GPU's tensor cores do
// that, and so do LibTorch's CPU kernels -- oneDNN's on a CPU with AVX-512, and on one without
// (AVX2 only) a scalar loop (at::native::cpublas's gemm with fp32 accumulation), 10-90x slower than
// the fp32 GEMM on the same operands (docs/benchmarks.md, "CPU"). Here, on the CPU:
//   y = round16( float(x) float(W)^T + float(b) )
// the same arithmetic up to the order of the fp32 additions (which differs between any two GEMMs),
// at the fp32 GEMM's speed, on every CPU alike. Bytes: the operands' fp32 copies (x and W read
// once more and written at twice their size), transient. On CUDA, and for fp32 or fp64 operands,
// LibTorch's ops run unchanged.
//
// linear_product is what the layers call in place of at::linear: autograd (backward dx = dy W,
// dW = dy^T x, db = sum(dy), each product as above) and autocast as at::linear's (under CPU
// autocast its operands are cast, weights through autocast's cache, as at::linear's would be).
// matmul_product and addmm_product are for the products inside kiln's own autograd functions:
// no autograd node, no autocast (their operands are already in the dtype the product runs in).
#pragma once

#include <ATen/core/Tensor.h>

#include "kernels/float8.h"

namespace kiln {

// y = x W^T + b: x [..., K], W [N, K], b [N] or undefined -> [..., N]. With `float8` on, the
// products are float8's (kernels/float8.h) on every device, x and b cast to autocast's dtype
// when it is on (the output's), W quantised from its own dtype.
at::Tensor linear_product(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = at::Tensor(),
                          const Float8Scaling* float8 = nullptr);

// a b: a [..., K], b [K, N] -> [..., N] (at::matmul with a 2-D second operand).
at::Tensor matmul_product(const at::Tensor& a, const at::Tensor& b);

// beta c + alpha a b, all 2-D (at::addmm); with beta 0, c is not read (its shape and dtype are).
at::Tensor addmm_product(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, double beta, double alpha);

// True when a product of these operands takes the fp32 GEMM (above): CPU, one 16-bit dtype.
bool upcast_product(const at::Tensor& a, const at::Tensor& b);

}  // namespace kiln
