// kernels/cublaslt.h -- one matrix product through cuBLASLt with an epilogue, for the fusions that
// put elementwise work inside a product (kernels/gelu_mlp.h). Only compiled with the kernels
// (KILN_WITH_KERNELS).
//
// kiln does not link cuBLASLt: LibTorch's CUDA half (libtorch_cuda.so, which needs it) is loaded
// on demand (distributed/cuda_backend.h), so a CPU process never maps it. The functions are taken
// with dlsym from the copy already loaded (libcublasLt.so.<major>, the major the toolkit's header
// names), once; cublasLt.h from the toolkit gives their types. A handle per device, and the
// heuristic's algorithm per product shape, are kept for the process (the same reuse LibTorch's
// own cuBLASLt calls make).
//
// Column-major, as cuBLAS: D [m x n] (leading dimension ldd) = epilogue(op(A) op(B)), op(A)
// [m x k], op(B) [k x n], fp32 accumulation, A, B, D of one 16-bit or fp32 type. Epilogues:
//   none           D = A B
//   bias           D = A B + bias (bias [m], D's type)
//   gelu_aux_bias  aux = A B + bias; D = gelu_tanh(aux)   (aux [m x n], leading dimension ld_aux,
//                  a multiple of 8)
//   dgelu          D = (A B) * gelu_tanh'(aux)           (aux: the forward's pre-activation)
#pragma once

#include <cstdint>
#include <string>

#include "kernels/cuda_launch.h"

namespace kiln::kernels {

enum class Epilogue { none, bias, gelu_aux_bias, dgelu };

struct LtProduct {
  DType type = DType::bf16;
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  void* d = nullptr;
  int64_t ldd = 0;
  Epilogue epilogue = Epilogue::none;
  const void* bias = nullptr;
  void* aux = nullptr;
  int64_t ld_aux = 0;
};

// Whether cuBLASLt's functions could be resolved in this process ("" if so, else why not).
std::string cublaslt_unavailable();

// Runs p on `device`'s handle and `stream` with `workspace` (16-byte aligned); "" on success, else
// what failed (the cuBLAS status and the call).
std::string cublaslt_matmul(const LtProduct& p, int device, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// The workspace cublaslt_matmul's callers hand it: 32 MiB, LibTorch's size on Hopper.
constexpr size_t kCublasLtWorkspaceBytes = size_t{32} << 20;

}  // namespace kiln::kernels
