// Our own packed GEMM (kernels/packed_gemm.h) as the MLP blocks call it, so
// the survey puts it beside the libraries in the same process:
// - NT (a forward, y = x W^T): SgemmPacked on W^T's pack;
// - NN (an input gradient, dx = dy W): SgemmPackedTransposed on the same
//   kind of pack (W^T's, as the forward made it);
// - TN (a weight gradient, dW += dy^T x): SgemmWeightGradient, one part.
// With pack_once the pack is made once per B pointer and kept (microbatches
// after a step's first, which read the pack its first made; valid only
// while B's contents do not change); without it every call packs op(B) as
// it goes (SgemmPacking), as the blocks run a GEMM that has no pack to
// read. The weight gradient packs its operands inside every call either
// way. The blocks use the packed GEMM up to PackedGemmMaxRows() rows (256
// on CPUs with AVX-512, else 128); the survey runs it at 256 everywhere.
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "kernels/blas.h"
#include "kernels/packed_gemm.h"
#include "tools/gemm_libs/gemm_backend.h"

namespace trainyard {
namespace gemm_libs {
namespace {

class Packed final : public GemmBackend {
 public:
  explicit Packed(bool pack_once) : pack_once_(pack_once) {}
  std::string Name() const override {
    return pack_once_ ? "packed" : "packed-stream";
  }
  std::string Description() const override {
    return absl::StrCat("ours: ", PackedGemmDescription(),
                        pack_once_ ? ", W packed once" : ", packing per call");
  }
  void SetThreads(int n) override { SetBlasThreads(n); }
  absl::Status Gemm(const GemmShape& s, const float* a, const float* b,
                    float beta, float* c) override {
    if (beta != 0.0f && beta != 1.0f) {
      return absl::InvalidArgumentError(
          absl::StrCat("packed: beta ", beta, " (only 0 or 1)"));
    }
    const bool accumulate = beta == 1.0f;
    if (s.trans_a && !s.trans_b) {  // TN: a weight gradient
      const GradientRows part{s.k, a, s.lda(), b, s.ldb()};
      return SgemmWeightGradient(s.m, s.n, {&part, 1}, accumulate, c, s.ldc());
    }
    if (s.trans_a) {
      return absl::InvalidArgumentError("packed: no TT GEMM in the block");
    }
    if (!pack_once_) {  // packing as it goes, as the blocks do with no pack
      return SgemmPacking(s.m, s.n, s.k, a, s.lda(), s.trans_b, b, s.ldb(),
                          accumulate, c, s.ldc());
    }
    // The pack of W^T: for NT, op(B) = b^T with b [n, k] = W; for NN, b
    // [k, n] = W and the pack is of W^T [n, k].
    const bool nt = s.trans_b;
    PackedMatrix* pack = &packs_[b];
    if (pack->data() == nullptr) {
      absl::Status st = nt ? pack->Pack(true, s.k, s.n, b, s.ldb())
                           : pack->Pack(true, s.n, s.k, b, s.ldb());
      if (!st.ok()) return st;
    }
    if (nt) return SgemmPacked(s.m, a, s.lda(), *pack, accumulate, c, s.ldc());
    return SgemmPackedTransposed(s.m, a, s.lda(), *pack, accumulate, c,
                                 s.ldc());
  }

 private:
  bool pack_once_;
  std::map<const float*, PackedMatrix> packs_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GemmBackend>> NewPackedBackend(bool pack_once) {
  if (absl::Status status = BlasStatus(); !status.ok()) return status;
  if (!PackedGemmEnabled()) {
    return absl::FailedPreconditionError(
        "the packed GEMM is off (TRAINYARD_PACKED_GEMM=0 or no AVX2/FMA)");
  }
  return std::unique_ptr<GemmBackend>(new Packed(pack_once));
}

}  // namespace gemm_libs
}  // namespace trainyard
