// BLIS through its typed API. The library is dlopen()ed (RTLD_LOCAL) so its
// BLAS/CBLAS compatibility symbols never meet OpenBLAS's in one namespace.
#include <dlfcn.h>

#include "absl/strings/str_cat.h"
#include "blis.h"
#include "tools/gemm_libs/gemm_backend.h"

namespace trainyard {
namespace gemm_libs {
namespace {

constexpr char kLibrary[] = "libblis.so.4";

struct BlisApi {
  decltype(&bli_sgemm) sgemm;
  decltype(&bli_thread_set_num_threads) set_num_threads;
  decltype(&bli_arch_query_id) arch_query_id;
  decltype(&bli_arch_string) arch_string;
  decltype(&bli_info_get_version_str) version;
};

class Blis final : public GemmBackend {
 public:
  explicit Blis(const BlisApi& api) : api_(api) {}
  std::string Name() const override { return "blis"; }
  std::string Description() const override {
    return absl::StrCat("BLIS ", api_.version(), " (",
                        api_.arch_string(api_.arch_query_id()), ")");
  }
  void SetThreads(int n) override { api_.set_num_threads(n); }
  absl::Status Gemm(const GemmShape& s, const float* a, const float* b,
                    float beta, float* c) override {
    // Row-major operands: row stride = leading dimension, column stride 1;
    // BLIS applies the transposes itself.
    float alpha = 1.0f;
    api_.sgemm(s.trans_a ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE,
               s.trans_b ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, s.m, s.n, s.k,
               &alpha, const_cast<float*>(a), s.lda(), 1, const_cast<float*>(b),
               s.ldb(), 1, &beta, c, s.ldc(), 1);
    return absl::OkStatus();
  }

 private:
  BlisApi api_;
};

template <typename Fn>
absl::Status Bind(void* handle, const char* name, Fn* fn) {
  *fn = reinterpret_cast<Fn>(dlsym(handle, name));
  if (*fn == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("symbol ", name, " not found in ", kLibrary));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<GemmBackend>> NewBlisBackend() {
  void* handle = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot load ", kLibrary,
        " (Debian package libblis4): ", err ? err : "unknown error"));
  }
  BlisApi api;
  for (absl::Status status :
       {Bind(handle, "bli_sgemm", &api.sgemm),
        Bind(handle, "bli_thread_set_num_threads", &api.set_num_threads),
        Bind(handle, "bli_arch_query_id", &api.arch_query_id),
        Bind(handle, "bli_arch_string", &api.arch_string),
        Bind(handle, "bli_info_get_version_str", &api.version)}) {
    if (!status.ok()) return status;
  }
  return std::unique_ptr<GemmBackend>(new Blis(api));
}

}  // namespace gemm_libs
}  // namespace trainyard
