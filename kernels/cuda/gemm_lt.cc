#include "kernels/cuda/gemm_lt.h"

#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/cuda/gemm_algo_cache.h"

namespace trainyard {
namespace gpu {

const char* GemmPrecisionName(GemmPrecision p) {
  switch (p) {
    case GemmPrecision::kFloat32:
      return "float32";
    case GemmPrecision::kTf32:
      return "tf32";
    case GemmPrecision::kBFloat16:
      return "bfloat16";
  }
  return "?";
}

const char* GemmEpilogueName(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::kNone:
      return "none";
    case GemmEpilogue::kBias:
      return "bias";
    case GemmEpilogue::kReluBias:
      return "relu_bias";
    case GemmEpilogue::kGeluTanhBias:
      return "gelu_tanh_bias";
    case GemmEpilogue::kReluAuxBias:
      return "relu_aux_bias";
    case GemmEpilogue::kGeluTanhAuxBias:
      return "gelu_tanh_aux_bias";
    case GemmEpilogue::kDReluBiasGrad:
      return "drelu_bgrad";
    case GemmEpilogue::kDGeluTanhBiasGrad:
      return "dgelu_tanh_bgrad";
    case GemmEpilogue::kBiasGradA:
      return "bgrad_a";
    case GemmEpilogue::kReluAux:
      return "relu_aux";
    case GemmEpilogue::kGeluTanhAux:
      return "gelu_tanh_aux";
    case GemmEpilogue::kDRelu:
      return "drelu";
    case GemmEpilogue::kDGeluTanh:
      return "dgelu_tanh";
  }
  return "?";
}

namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

cublasLtEpilogue_t ToLt(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::kNone:
      return CUBLASLT_EPILOGUE_DEFAULT;
    case GemmEpilogue::kBias:
      return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::kReluBias:
      return CUBLASLT_EPILOGUE_RELU_BIAS;
    case GemmEpilogue::kGeluTanhBias:
      return CUBLASLT_EPILOGUE_GELU_BIAS;
    case GemmEpilogue::kReluAuxBias:
      return CUBLASLT_EPILOGUE_RELU_AUX_BIAS;
    case GemmEpilogue::kGeluTanhAuxBias:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case GemmEpilogue::kDReluBiasGrad:
      return CUBLASLT_EPILOGUE_DRELU_BGRAD;
    case GemmEpilogue::kDGeluTanhBiasGrad:
      return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    case GemmEpilogue::kBiasGradA:
      return CUBLASLT_EPILOGUE_BGRADB;
    case GemmEpilogue::kReluAux:
      return CUBLASLT_EPILOGUE_RELU_AUX;
    case GemmEpilogue::kGeluTanhAux:
      return CUBLASLT_EPILOGUE_GELU_AUX;
    case GemmEpilogue::kDRelu:
      return CUBLASLT_EPILOGUE_DRELU;
    case GemmEpilogue::kDGeluTanh:
      return CUBLASLT_EPILOGUE_DGELU;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

bool UsesBias(GemmEpilogue e) {
  return e == GemmEpilogue::kBias || e == GemmEpilogue::kReluBias ||
         e == GemmEpilogue::kGeluTanhBias || e == GemmEpilogue::kReluAuxBias ||
         e == GemmEpilogue::kGeluTanhAuxBias;
}
bool UsesBiasGrad(GemmEpilogue e) {
  return e == GemmEpilogue::kDReluBiasGrad ||
         e == GemmEpilogue::kDGeluTanhBiasGrad || e == GemmEpilogue::kBiasGradA;
}
// The ReLU bitmask (ld_aux in bits, a multiple of 128).
bool UsesReluMask(GemmEpilogue e) {
  return e == GemmEpilogue::kReluAuxBias || e == GemmEpilogue::kReluAux ||
         e == GemmEpilogue::kDReluBiasGrad || e == GemmEpilogue::kDRelu;
}
// The GELU pre-activation matrix (ld_aux in elements, a multiple of 8).
bool UsesGeluAux(GemmEpilogue e) {
  return e == GemmEpilogue::kGeluTanhAuxBias ||
         e == GemmEpilogue::kGeluTanhAux ||
         e == GemmEpilogue::kDGeluTanhBiasGrad || e == GemmEpilogue::kDGeluTanh;
}
bool UsesAux(GemmEpilogue e) { return UsesReluMask(e) || UsesGeluAux(e); }

// Largest power of two <= 16 dividing the address.
int Alignment(const void* p) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(p);
  int a = 16;
  while (a > 1 && v % a != 0) a /= 2;
  return a;
}

absl::Status Validate(const GemmArgs& g) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("GemmLt (m=", g.m, " n=", g.n, " k=", g.k, ", ",
                     GemmPrecisionName(g.precision), ", epilogue ",
                     GemmEpilogueName(g.epilogue), "): ", why));
  };
  if (g.m < 0 || g.n < 0 || g.k <= 0) return bad("need m, n >= 0 and k > 0");
  if (g.a == nullptr || g.b == nullptr || g.d == nullptr) {
    return bad("a, b and d must be non-null");
  }
  if (g.lda < (g.trans_a ? g.m : g.k) || g.lda < 1) {
    return bad(absl::StrCat("lda ", g.lda, " too small"));
  }
  if (g.ldb < (g.trans_b ? g.k : g.n) || g.ldb < 1) {
    return bad(absl::StrCat("ldb ", g.ldb, " too small"));
  }
  if (g.ldd < g.n || g.ldd < 1) {
    return bad(absl::StrCat("ldd ", g.ldd, " too small"));
  }
  if (g.beta != 0.0f && (g.c == nullptr || g.ldc < g.n)) {
    return bad("beta != 0 needs c with ldc >= n");
  }
  if (g.d_type != DType::kFloat32 && g.d_type != DType::kBFloat16) {
    return bad(absl::StrCat("d_type ", DTypeName(g.d_type),
                            " is not supported (float32 or bfloat16)"));
  }
  if (g.d_type == DType::kBFloat16 && g.precision != GemmPrecision::kBFloat16) {
    return bad("bfloat16 output needs bfloat16 precision");
  }
  if (UsesBias(g.epilogue) && g.bias == nullptr) return bad("bias is null");
  if (UsesBiasGrad(g.epilogue) && g.bias_grad == nullptr) {
    return bad("bias_grad is null");
  }
  if (UsesAux(g.epilogue) && (g.aux == nullptr || g.ld_aux < g.n)) {
    return bad("aux is null or ld_aux < n");
  }
  return absl::OkStatus();
}

// cuBLASLt's rule for ld_aux (CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD in
// cublasLt.h), checked here so that breaking it is Unimplemented, not
// whatever the heuristic makes of it.
absl::Status CheckAuxLd(const GemmArgs& g) {
  const int64_t multiple = UsesReluMask(g.epilogue)  ? 128
                           : UsesGeluAux(g.epilogue) ? 8
                                                     : 1;
  if (g.ld_aux % multiple == 0) return absl::OkStatus();
  return absl::UnimplementedError(
      absl::StrCat("GemmLt (m=", g.m, " n=", g.n, " k=", g.k, ", epilogue ",
                   GemmEpilogueName(g.epilogue),
                   "): cuBLASLt needs ld_aux to be a multiple of ", multiple,
                   ", got ", g.ld_aux));
}

// cuBLASLt's heuristic is told the alignment of A, B, C and D only; its
// epilogue kernels may assume 16-byte aligned bias, bias-gradient and aux
// pointers and fault on others (a fault poisons the whole CUDA context). A
// stage's biases are views into one flat parameter buffer, so they can sit
// at any 4-byte offset: such a call is Unimplemented, and the caller takes
// its element-wise path.
absl::Status CheckEpiloguePointers(const GemmArgs& g) {
  const void* const pointers[] = {g.bias, g.bias_grad, g.aux};
  for (const void* p : pointers) {
    if (p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 != 0) {
      return absl::UnimplementedError(
          absl::StrCat("GemmLt (m=", g.m, " n=", g.n, " k=", g.k, ", epilogue ",
                       GemmEpilogueName(g.epilogue),
                       "): a bias or aux pointer is not 16-byte aligned"));
    }
  }
  return absl::OkStatus();
}

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo;
  ~Plan() {
    if (op) cublasLtMatmulDescDestroy(op);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (d) cublasLtMatrixLayoutDestroy(d);
  }
};

std::string PlanKey(const GemmArgs& g) {
  return absl::StrCat(
      g.trans_a, ",", g.trans_b, ",", g.m, ",", g.n, ",", g.k, ",",
      static_cast<int>(g.precision), ",", g.lda, ",", g.ldb, ",", g.ldc, ",",
      g.ldd, ",", static_cast<int>(g.d_type), ",", static_cast<int>(g.epilogue),
      ",", g.ld_aux, ",", g.beta != 0.0f, ",", Alignment(g.a), Alignment(g.b),
      Alignment(g.c), Alignment(g.d), Alignment(g.bias), Alignment(g.bias_grad),
      Alignment(g.aux));
}

// "NVIDIA H100 80GB HBM3/132/130100": what a tuned choice is valid for.
std::string GpuModel(int device) {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return "unknown";
  }
  return absl::StrCat(prop.name, "/", prop.multiProcessorCount, "/",
                      cublasLtGetVersion());
}

// The process's tuned choices (see gemm_algo_cache.h).
GemmAlgoCache& AlgoCache() {
  static GemmAlgoCache* const cache =
      new GemmAlgoCache(GemmLt::kTuneCandidates);
  return *cache;
}

bool TuningEnabled() {
  const char* v = std::getenv("TRAINYARD_GEMM_TUNE");
  return v == nullptr || std::string(v) != "0";
}

// Times each of the `found` candidates once (after a warm-up run) on the
// real arguments (beta == 0: D is only written) and returns the fastest's
// index. Synchronises the stream.
absl::StatusOr<int> TuneAlgo(cublasLtHandle_t handle, const GemmArgs& g,
                             const Plan& p,
                             const cublasLtMatmulHeuristicResult_t* results,
                             int found, const void* c_ptr, void* workspace,
                             size_t workspace_bytes, Stream stream) {
  cudaEvent_t start = nullptr, stop = nullptr;
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
  int best = 0;
  float best_ms = -1;
  for (int i = 0; i < found; ++i) {
    auto run = [&] {
      return cublasLtMatmul(handle, p.op, &g.alpha, g.b, p.a, g.a, p.b, &g.beta,
                            c_ptr, p.c, g.d, p.d, &results[i].algo, workspace,
                            workspace_bytes, stream);
    };
    if (run() != CUBLAS_STATUS_SUCCESS) continue;  // warm-up; skip failures
    cudaEventRecord(start, stream);
    const cublasStatus_t st = run();
    cudaEventRecord(stop, stream);
    if (st != CUBLAS_STATUS_SUCCESS ||
        cudaEventSynchronize(stop) != cudaSuccess) {
      cudaGetLastError();
      continue;
    }
    float ms = 0;
    if (cudaEventElapsedTime(&ms, start, stop) != cudaSuccess) continue;
    if (best_ms < 0 || ms < best_ms) {
      best_ms = ms;
      best = i;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best;
}

// A plan for `g`: its descriptors and layouts, no algorithm yet. `ldc` is
// C's leading dimension (D's when beta == 0: C is then D).
absl::StatusOr<std::unique_ptr<Plan>> CreatePlan(const GemmArgs& g,
                                                 int64_t ldc) {
  const cudaDataType_t ab_type =
      g.precision == GemmPrecision::kBFloat16 ? CUDA_R_16BF : CUDA_R_32F;
  const cudaDataType_t cd_type =
      g.d_type == DType::kBFloat16 ? CUDA_R_16BF : CUDA_R_32F;
  const cublasLtEpilogue_t epilogue = ToLt(g.epilogue);
  const cublasOperation_t op_a = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  auto p = std::make_unique<Plan>();
  const cublasComputeType_t compute = g.precision == GemmPrecision::kTf32
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&p->op, compute, CUDA_R_32F));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      p->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      p->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  if (UsesBias(g.epilogue) || UsesBiasGrad(g.epilogue)) {
    const int32_t bias_type = CUDA_R_32F;
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
        sizeof(bias_type)));
  }
  if (UsesAux(g.epilogue)) {
    const int64_t ld_aux = g.ld_aux;
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld_aux, sizeof(ld_aux)));
  }
  // Column-major view: D^T [n, m] = op(B)^T [n, k] @ op(A)^T [k, m].
  CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(
      &p->a, ab_type, g.trans_b ? g.k : g.n, g.trans_b ? g.n : g.k, g.ldb));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(
      &p->b, ab_type, g.trans_a ? g.m : g.k, g.trans_a ? g.k : g.m, g.lda));
  CUBLAS_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(&p->c, cd_type, g.n, g.m, ldc));
  CUBLAS_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(&p->d, cd_type, g.n, g.m, g.ldd));
  return p;
}

// Points the plan's descriptor at g's bias (or bias gradient) and aux
// buffers, which may differ from call to call.
absl::Status SetEpiloguePointers(const GemmArgs& g, const Plan& p) {
  if (UsesBias(g.epilogue) || UsesBiasGrad(g.epilogue)) {
    const void* bias =
        UsesBias(g.epilogue) ? static_cast<const void*>(g.bias) : g.bias_grad;
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  if (UsesAux(g.epilogue)) {
    void* aux = g.aux;
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
  }
  return absl::OkStatus();
}

// Asks cuBLASLt's heuristic for up to GemmLt::kTuneCandidates algorithms
// for plan `p` (told the pointers' alignments and `workspace_bytes`, and
// kept from in-place split-K reductions) into results[0, *found); returns
// the heuristic's status, or an error when no preference can be made.
absl::StatusOr<cublasStatus_t> Heuristic(
    cublasLtHandle_t handle, const GemmArgs& g, const Plan& p,
    const void* c_ptr, uint64_t workspace_bytes,
    cublasLtMatmulHeuristicResult_t* results, int* found) {
  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = workspace_bytes;
  const uint32_t align_a = Alignment(g.b), align_b = Alignment(g.a),
                 align_c = Alignment(c_ptr), align_d = Alignment(g.d);
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  if (st == CUBLAS_STATUS_SUCCESS) {
    cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
        sizeof(align_a));
    cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
        sizeof(align_b));
    cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
        sizeof(align_c));
    cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d,
        sizeof(align_d));
    // Split-K only with a separate reduction step, never in place.
    const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE |
                             CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE |
                             CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
    cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
        sizeof(schemes));
    st =
        cublasLtMatmulAlgoGetHeuristic(handle, p.op, p.a, p.b, p.c, p.d, pref,
                                       GemmLt::kTuneCandidates, results, found);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  return st;
}

}  // namespace

struct GemmLt::Impl {
  int device = 0;
  std::string model;  // GpuModel(device)
  cublasLtHandle_t handle = nullptr;
  DeviceBuffer workspace;
  absl::flat_hash_map<std::string, std::unique_ptr<Plan>> plans;
  ~Impl() {
    plans.clear();
    if (handle) cublasLtDestroy(handle);
  }

  // Picks the algorithm of the fresh plan `p` for `g`: the heuristic's
  // first, or the tuned (cached) one. Without any, drops the plan (p
  // dangles then) and returns Unimplemented.
  absl::Status ChooseAlgo(const GemmArgs& g, const void* c_ptr, Plan& p,
                          Stream stream);
};

absl::Status GemmLt::Impl::ChooseAlgo(const GemmArgs& g, const void* c_ptr,
                                      Plan& p, Stream stream) {
  cublasLtMatmulHeuristicResult_t results[kTuneCandidates] = {};
  int found = 0;
  ASSIGN_OR_RETURN(
      const cublasStatus_t st,
      Heuristic(handle, g, p, c_ptr, workspace.size(), results, &found));
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    plans.erase(PlanKey(g));
    return absl::UnimplementedError(absl::StrCat(
        "GemmLt: cuBLASLt has no algorithm for m=", g.m, " n=", g.n, " k=", g.k,
        " trans_a=", g.trans_a, " trans_b=", g.trans_b, " ",
        GemmPrecisionName(g.precision), " -> ", DTypeName(g.d_type),
        ", epilogue ", GemmEpilogueName(g.epilogue), " (",
        st == CUBLAS_STATUS_SUCCESS ? "no result" : cublasGetStatusString(st),
        ")"));
  }
  int chosen = 0;
  if (found > 1 && g.beta == 0.0f && TuningEnabled()) {
    const std::string key = absl::StrCat(model, "|", PlanKey(g));
    if (!AlgoCache().Lookup(key, &chosen) || chosen >= found) {
      ASSIGN_OR_RETURN(chosen,
                       TuneAlgo(handle, g, p, results, found, c_ptr,
                                workspace.data(), workspace.size(), stream));
      AlgoCache().Store(key, chosen);
    }
  }
  p.algo = results[chosen].algo;
  return absl::OkStatus();
}

GemmLt::GemmLt(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GemmLt::~GemmLt() = default;
int64_t GemmLt::cached_plans() const { return impl_->plans.size(); }

absl::StatusOr<std::unique_ptr<GemmLt>> GemmLt::Create(int device) {
  absl::Status ok = CheckDevice(device);
  if (!ok.ok()) {
    return absl::Status(
        ok.code(), absl::StrCat("GemmLt on cuda:", device, ": ", ok.message()));
  }
  auto impl = std::make_unique<Impl>();
  impl->device = device;
  impl->model = GpuModel(device);
  absl::StatusOr<DeviceBuffer> ws =
      DeviceBuffer::Allocate(device, kWorkspaceBytes);
  if (!ws.ok()) return ws.status();
  impl->workspace = std::move(*ws);
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&impl->handle));
  return std::unique_ptr<GemmLt>(new GemmLt(std::move(impl)));
}

absl::Status GemmLt::Run(const GemmArgs& g, Stream stream) {
  RETURN_IF_ERROR(Validate(g));
  if (g.m == 0 || g.n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckAuxLd(g));
  RETURN_IF_ERROR(CheckEpiloguePointers(g));
  const void* c_ptr = g.beta != 0.0f ? g.c : g.d;
  const int64_t ldc = g.beta != 0.0f ? g.ldc : g.ldd;

  std::unique_ptr<Plan>& plan = impl_->plans[PlanKey(g)];
  const bool fresh = plan == nullptr;
  if (fresh) {
    ASSIGN_OR_RETURN(plan, CreatePlan(g, ldc));
  }
  Plan& p = *plan;
  RETURN_IF_ERROR(SetEpiloguePointers(g, p));
  if (fresh) RETURN_IF_ERROR(impl_->ChooseAlgo(g, c_ptr, p, stream));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(impl_->handle, p.op, &g.alpha, g.b, p.a,
                                        g.a, p.b, &g.beta, c_ptr, p.c, g.d, p.d,
                                        &p.algo, impl_->workspace.data(),
                                        impl_->workspace.size(), stream));
  return absl::OkStatus();
}

}  // namespace gpu
}  // namespace trainyard
