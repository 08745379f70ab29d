// OpenBLAS two ways: as kernels/blas.cc calls it (our tiling, our pool) and
// with OpenBLAS's own threading, for comparison.
#include <dlfcn.h>

#include "absl/strings/str_cat.h"
#include "kernels/blas.h"
#include "tools/gemm_libs/gemm_backend.h"

namespace trainyard {
namespace gemm_libs {
namespace {

class OpenBlasTiled final : public GemmBackend {
 public:
  std::string Name() const override { return "openblas"; }
  std::string Description() const override { return BlasDescription(); }
  void SetThreads(int n) override { SetBlasThreads(n); }
  absl::Status Gemm(const GemmShape& s, const float* a, const float* b,
                    float beta, float* c) override {
    return Sgemm(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0f, a, s.lda(), b,
                 s.ldb(), beta, c, s.ldc());
  }
};

// CBLAS enum values (cblas.h).
constexpr int kRowMajor = 101;
constexpr int kNoTrans = 111;
constexpr int kTrans = 112;

using CblasSgemmFn = void (*)(int, int, int, int, int, int, float, const float*,
                              int, const float*, int, float, float*, int);
using SetThreadsFn = void (*)(int);

class OpenBlasNative final : public GemmBackend {
 public:
  OpenBlasNative(CblasSgemmFn sgemm, SetThreadsFn set_threads)
      : sgemm_(sgemm), set_threads_(set_threads) {}
  std::string Name() const override { return "openblas-mt"; }
  std::string Description() const override {
    return "OpenBLAS, its own threading (one call)";
  }
  void SetThreads(int n) override { threads_ = n; }
  absl::Status Gemm(const GemmShape& s, const float* a, const float* b,
                    float beta, float* c) override {
    // kernels/blas.cc's tiles expect OpenBLAS single-threaded: restore it.
    set_threads_(threads_);
    sgemm_(kRowMajor, s.trans_a ? kTrans : kNoTrans,
           s.trans_b ? kTrans : kNoTrans, static_cast<int>(s.m),
           static_cast<int>(s.n), static_cast<int>(s.k), 1.0f, a,
           static_cast<int>(s.lda()), b, static_cast<int>(s.ldb()), beta, c,
           static_cast<int>(s.ldc()));
    set_threads_(1);
    return absl::OkStatus();
  }

 private:
  CblasSgemmFn sgemm_;
  SetThreadsFn set_threads_;
  int threads_ = 1;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GemmBackend>> NewOpenBlasTiledBackend() {
  if (absl::Status status = BlasStatus(); !status.ok()) return status;
  return std::unique_ptr<GemmBackend>(new OpenBlasTiled());
}

absl::StatusOr<std::unique_ptr<GemmBackend>> NewOpenBlasNativeBackend() {
  // The handle kernels/blas.cc opened (RTLD_NOLOAD: never a second copy,
  // which would miss its OPENBLAS_CORETYPE setting).
  void* handle = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) {
    return absl::FailedPreconditionError(
        "libopenblas.so.0 is not loaded (create the tiled backend first)");
  }
  auto sgemm = reinterpret_cast<CblasSgemmFn>(dlsym(handle, "cblas_sgemm"));
  auto set_threads =
      reinterpret_cast<SetThreadsFn>(dlsym(handle, "openblas_set_num_threads"));
  if (sgemm == nullptr || set_threads == nullptr) {
    return absl::FailedPreconditionError(
        "cblas_sgemm or openblas_set_num_threads not found in "
        "libopenblas.so.0");
  }
  return std::unique_ptr<GemmBackend>(new OpenBlasNative(sgemm, set_threads));
}

}  // namespace gemm_libs
}  // namespace trainyard
