// kernels/cublaslt.cpp -- cuBLASLt's functions from the loaded library, and one product with them.
// Compiled only with the kernels (CMakeLists.txt: KILN_KERNELS and a CUDA LibTorch).
#include "kernels/cublaslt.h"

#include <dlfcn.h>

#include <array>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include <cublasLt.h>

namespace kiln::kernels {

namespace {

struct Api {
  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
  std::string error;
};

const Api& api() {
  static const Api a = [] {
    Api r;
    const std::string name = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
    void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_NOLOAD);  // LibTorch's CUDA half loaded it
    if (!lib) lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* e = dlerror();
      r.error = "cannot load " + name + ": " + (e ? e : "unknown reason");
      return r;
    }
    auto get = [&](auto& fn, const char* symbol) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, symbol));
      if (!fn && r.error.empty()) r.error = name + " has no " + symbol;
    };
    get(r.create, "cublasLtCreate");
    get(r.desc_create, "cublasLtMatmulDescCreate");
    get(r.desc_destroy, "cublasLtMatmulDescDestroy");
    get(r.desc_set, "cublasLtMatmulDescSetAttribute");
    get(r.layout_create, "cublasLtMatrixLayoutCreate");
    get(r.layout_destroy, "cublasLtMatrixLayoutDestroy");
    get(r.pref_create, "cublasLtMatmulPreferenceCreate");
    get(r.pref_destroy, "cublasLtMatmulPreferenceDestroy");
    get(r.pref_set, "cublasLtMatmulPreferenceSetAttribute");
    get(r.heuristic, "cublasLtMatmulAlgoGetHeuristic");
    get(r.matmul, "cublasLtMatmul");
    return r;
  }();
  return a;
}

cudaDataType_t cuda_type(DType t) {
  return t == DType::bf16 ? CUDA_R_16BF : t == DType::f16 ? CUDA_R_16F : CUDA_R_32F;
}

cublasLtEpilogue_t lt_epilogue(Epilogue e) {
  switch (e) {
    case Epilogue::bias: return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::gelu_aux_bias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case Epilogue::dgelu: return CUBLASLT_EPILOGUE_DGELU;
    default: return CUBLASLT_EPILOGUE_DEFAULT;
  }
}

// The descriptors of one product, destroyed on every path out.
struct Descriptors {
  const Api& a;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  explicit Descriptors(const Api& api_) : a(api_) {}
  ~Descriptors() {
    if (pref) a.pref_destroy(pref);
    if (ld) a.layout_destroy(ld);
    if (lb) a.layout_destroy(lb);
    if (la) a.layout_destroy(la);
    if (op) a.desc_destroy(op);
  }
};

std::string failed(const char* call, cublasStatus_t s) { return std::string(call) + ": cuBLAS status " + std::to_string(static_cast<int>(s)); }

}  // namespace

std::string cublaslt_unavailable() { return api().error; }

std::string cublaslt_matmul(const LtProduct& p, int device, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const Api& a = api();
  if (!a.error.empty()) return a.error;
  static std::mutex mu;
  static std::array<cublasLtHandle_t, 64> handles{};
  using Key = std::tuple<int, int, bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int64_t>;
  static std::map<Key, cublasLtMatmulAlgo_t> algos;
  if (device < 0 || device >= static_cast<int>(handles.size())) return "cuBLASLt: device index " + std::to_string(device);
  std::unique_lock<std::mutex> lock(mu);
  if (!handles[static_cast<size_t>(device)]) {
    if (cublasStatus_t s = a.create(&handles[static_cast<size_t>(device)]); s != CUBLAS_STATUS_SUCCESS) return failed("cublasLtCreate", s);
  }
  const cublasLtHandle_t handle = handles[static_cast<size_t>(device)];
  lock.unlock();

  Descriptors ds(a);
  const cudaDataType_t t = cuda_type(p.type);
  cublasStatus_t s;
  if ((s = a.desc_create(&ds.op, CUBLAS_COMPUTE_32F, CUDA_R_32F)) != CUBLAS_STATUS_SUCCESS) return failed("cublasLtMatmulDescCreate", s);
  const cublasOperation_t ta = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasLtEpilogue_t epi = lt_epilogue(p.epilogue);
  if ((s = a.desc_set(ds.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta)) != CUBLAS_STATUS_SUCCESS ||
      (s = a.desc_set(ds.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb)) != CUBLAS_STATUS_SUCCESS ||
      (s = a.desc_set(ds.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi)) != CUBLAS_STATUS_SUCCESS) {
    return failed("cublasLtMatmulDescSetAttribute", s);
  }
  if (p.epilogue == Epilogue::bias || p.epilogue == Epilogue::gelu_aux_bias) {
    if ((s = a.desc_set(ds.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t, sizeof t)) != CUBLAS_STATUS_SUCCESS ||
        (s = a.desc_set(ds.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof p.bias)) != CUBLAS_STATUS_SUCCESS) {
      return failed("cublasLtMatmulDescSetAttribute (bias)", s);
    }
  }
  if (p.epilogue == Epilogue::gelu_aux_bias || p.epilogue == Epilogue::dgelu) {
    if ((s = a.desc_set(ds.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &p.aux, sizeof p.aux)) != CUBLAS_STATUS_SUCCESS ||
        (s = a.desc_set(ds.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &p.ld_aux, sizeof p.ld_aux)) != CUBLAS_STATUS_SUCCESS ||
        (s = a.desc_set(ds.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &t, sizeof t)) != CUBLAS_STATUS_SUCCESS) {
      return failed("cublasLtMatmulDescSetAttribute (aux)", s);
    }
  }
  // Layouts of the stored matrices: A is m x k, or k x m when transposed; B likewise.
  const uint64_t ar = p.trans_a ? p.k : p.m, ac = p.trans_a ? p.m : p.k;
  const uint64_t br = p.trans_b ? p.n : p.k, bc = p.trans_b ? p.k : p.n;
  if ((s = a.layout_create(&ds.la, t, ar, ac, p.lda)) != CUBLAS_STATUS_SUCCESS ||
      (s = a.layout_create(&ds.lb, t, br, bc, p.ldb)) != CUBLAS_STATUS_SUCCESS ||
      (s = a.layout_create(&ds.ld, t, static_cast<uint64_t>(p.m), static_cast<uint64_t>(p.n), p.ldd)) != CUBLAS_STATUS_SUCCESS) {
    return failed("cublasLtMatrixLayoutCreate", s);
  }

  const Key key{device, static_cast<int>(p.type), p.trans_a, p.trans_b, p.m, p.n, p.k, p.lda, p.ldb, p.ldd,
                static_cast<int>(p.epilogue), p.ld_aux};
  cublasLtMatmulAlgo_t algo;
  lock.lock();
  auto it = algos.find(key);
  const bool known = it != algos.end();
  if (known) algo = it->second;
  lock.unlock();
  if (!known) {
    if ((s = a.pref_create(&ds.pref)) != CUBLAS_STATUS_SUCCESS) return failed("cublasLtMatmulPreferenceCreate", s);
    if ((s = a.pref_set(ds.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes, sizeof workspace_bytes)) !=
        CUBLAS_STATUS_SUCCESS) {
      return failed("cublasLtMatmulPreferenceSetAttribute", s);
    }
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    s = a.heuristic(handle, ds.op, ds.la, ds.lb, ds.ld, ds.ld, ds.pref, 1, &result, &found);
    if (s != CUBLAS_STATUS_SUCCESS || found == 0) {
      return "cuBLASLt has no algorithm for this product (m " + std::to_string(p.m) + ", n " + std::to_string(p.n) +
             ", k " + std::to_string(p.k) + ", epilogue " + std::to_string(static_cast<int>(p.epilogue)) + ")";
    }
    algo = result.algo;
    lock.lock();
    algos.emplace(key, algo);
    lock.unlock();
  }
  const float alpha = 1.0f, beta = 0.0f;
  s = a.matmul(handle, ds.op, &alpha, p.a, ds.la, p.b, ds.lb, &beta, p.d, ds.ld, p.d, ds.ld, &algo, workspace,
               workspace_bytes, stream);
  if (s != CUBLAS_STATUS_SUCCESS) return failed("cublasLtMatmul", s);
  return "";
}

}  // namespace kiln::kernels
