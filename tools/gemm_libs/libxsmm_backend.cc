// libxsmm JIT kernels under a shape-only tiling. libxsmm kernels are
// column-major, so a row-major C = op(A) op(B) runs as the column-major
// C^T = op(B)^T op(A)^T: the first column-major operand is B, the second A.
#include <libxsmm.h>
#include <omp.h>

#include <algorithm>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tools/gemm_libs/gemm_backend.h"

namespace trainyard {
namespace gemm_libs {
namespace {

// Tile of the column-major C^T: kTileRows of C's columns, kTileCols of C's
// rows, k walked in kTileK steps (fixed order: the same bits for any
// thread count).
constexpr int64_t kTileRows = 64;
constexpr int64_t kTileCols = 64;
constexpr int64_t kTileK = 256;

// The column-major problem C' [m, n] (+)= A' [m, k] B' [k, n], with B'
// stored transposed when trans_b.
struct ColMajor {
  int64_t m, n, k;
  const float* a;
  int64_t lda;
  const float* b;
  int64_t ldb;
  bool trans_b;
  float* c;
  int64_t ldc;
};

// One tile of C': every k block in order, the first with beta.
absl::Status RunTile(const ColMajor& p, int64_t i0, int64_t j0, float beta) {
  const libxsmm_blasint mb = std::min(kTileRows, p.m - i0);
  const libxsmm_blasint nb = std::min(kTileCols, p.n - j0);
  const libxsmm_blasint lda = p.lda, ldb = p.ldb, ldc = p.ldc;
  const int flags = p.trans_b ? LIBXSMM_GEMM_FLAG_TRANS_B : 0;
  const float alpha = 1.0f;
  for (int64_t p0 = 0; p0 < p.k; p0 += kTileK) {
    const libxsmm_blasint kb = std::min(kTileK, p.k - p0);
    const float tile_beta = p0 == 0 ? beta : 1.0f;
    const libxsmm_smmfunction kernel = libxsmm_smmdispatch(
        mb, nb, kb, &lda, &ldb, &ldc, &alpha, &tile_beta, &flags, nullptr);
    if (kernel == nullptr) {
      return absl::InternalError(
          absl::StrCat("libxsmm: no JIT kernel for m=", mb, " n=", nb,
                       " k=", kb, " flags=", flags));
    }
    const float* b = p.trans_b ? p.b + j0 + p0 * p.ldb : p.b + p0 + j0 * p.ldb;
    kernel(p.a + i0 + p0 * p.lda, b, p.c + i0 + j0 * p.ldc);
  }
  return absl::OkStatus();
}

class Libxsmm final : public GemmBackend {
 public:
  explicit Libxsmm(bool pack_once) : pack_once_(pack_once) {}
  std::string Name() const override {
    return pack_once_ ? "libxsmm-packW" : "libxsmm";
  }
  std::string Description() const override {
    return absl::StrCat("libxsmm ", LIBXSMM_VERSION, " JIT (",
                        libxsmm_get_target_arch(), ") under our tiling",
                        pack_once_ ? ", NT weights transposed once" : "");
  }
  void SetThreads(int n) override { threads_ = n; }
  absl::Status Gemm(const GemmShape& s, const float* a, const float* b,
                    float beta, float* c) override;

 private:
  // B [n, k] row-major as [k, n] row-major (per call, or cached).
  const float* TransposedB(const GemmShape& s, const float* b);

  bool pack_once_;
  int threads_ = 1;
  std::vector<float> scratch_;
  std::map<const float*, std::vector<float>> packed_;
};

const float* Libxsmm::TransposedB(const GemmShape& s, const float* b) {
  std::vector<float>* out = &scratch_;
  if (pack_once_) {
    auto [it, fresh] = packed_.try_emplace(b);
    if (!fresh) return it->second.data();
    out = &it->second;
  }
  out->resize(s.n * s.k);
  float* dst = out->data();
  // Rows [j0, j0 + 64) of B, i.e. a k x 64 column-major block, each.
  const int64_t chunks = (s.n + 63) / 64;
#pragma omp parallel for num_threads(threads_) schedule(static)
  for (int64_t t = 0; t < chunks; ++t) {
    const int64_t j0 = t * 64;
    libxsmm_otrans(dst + j0, b + j0 * s.ldb(), sizeof(float), s.k,
                   std::min<int64_t>(64, s.n - j0), s.ldb(), s.n);
  }
  return dst;
}

absl::Status Libxsmm::Gemm(const GemmShape& s, const float* a, const float* b,
                           float beta, float* c) {
  ColMajor p{s.n, s.m, s.k, b, s.ldb(), a, s.lda(), s.trans_a, c, s.ldc()};
  if (s.trans_b) {
    // No JIT kernel takes a transposed first operand: transpose B.
    p.a = TransposedB(s, b);
    p.lda = s.n;
  }
  const int64_t row_tiles = (p.m + kTileRows - 1) / kTileRows;
  const int64_t tiles = row_tiles * ((p.n + kTileCols - 1) / kTileCols);
  std::vector<absl::Status> errors(tiles);
#pragma omp parallel for num_threads(threads_) schedule(dynamic, 1)
  for (int64_t t = 0; t < tiles; ++t) {
    errors[t] = RunTile(p, (t % row_tiles) * kTileRows,
                        (t / row_tiles) * kTileCols, beta);
  }
  for (const absl::Status& e : errors) {
    if (!e.ok()) return e;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<GemmBackend>> NewLibxsmmBackend(bool pack_once) {
  libxsmm_init();
  return std::unique_ptr<GemmBackend>(new Libxsmm(pack_once));
}

}  // namespace gemm_libs
}  // namespace trainyard
