// oneDNN matmul: plain GEMMs, and fc1 with bias + GELU fused as post-ops.
// Primitives are created on first use per shape and thread count (oneDNN's
// OpenMP runtime reads the thread count when it runs).
#include <omp.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/blas.h"
#include "kernels/parallel.h"
#include "oneapi/dnnl/dnnl.hpp"
#include "tools/gemm_libs/gemm_backend.h"

namespace trainyard {
namespace gemm_libs {
namespace {

using dnnl::memory;

// A row-major [rows, cols] matrix, or the transpose of a stored
// [cols, rows] one (strides swap).
memory::desc Matrix(int64_t rows, int64_t cols, bool transposed) {
  return memory::desc(
      {rows, cols}, memory::data_type::f32,
      transposed ? memory::dims{1, rows} : memory::dims{cols, 1});
}

std::string Version() {
  const dnnl_version_t* v = dnnl_version();
  return absl::StrCat("oneDNN ", v->major, ".", v->minor, ".", v->patch);
}

// Runs one matmul; oneDNN reports errors as dnnl::error exceptions.
absl::Status Execute(const dnnl::matmul& prim, const dnnl::engine& engine,
                     dnnl::stream& stream,
                     const dnnl::matmul::primitive_desc& pd, const float* a,
                     const float* b, const float* bias, float* c) {
  try {
    std::unordered_map<int, memory> args = {
        {DNNL_ARG_SRC, memory(pd.src_desc(), engine, const_cast<float*>(a))},
        {DNNL_ARG_WEIGHTS,
         memory(pd.weights_desc(), engine, const_cast<float*>(b))},
        {DNNL_ARG_DST, memory(pd.dst_desc(), engine, c)}};
    if (bias != nullptr) {
      args.emplace(DNNL_ARG_BIAS,
                   memory(pd.bias_desc(), engine, const_cast<float*>(bias)));
    }
    prim.execute(stream, args);
    stream.wait();
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("oneDNN matmul: ", e.what()));
  }
  return absl::OkStatus();
}

struct Primitive {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
};

// Creates a matmul primitive; logs the implementation oneDNN picked.
absl::StatusOr<Primitive> Create(const dnnl::engine& engine,
                                 const dnnl::matmul::desc& desc,
                                 const dnnl::post_ops& post_ops,
                                 const std::string& what,
                                 bool user_scratchpad = false) {
  try {
    dnnl::primitive_attr attr;
    attr.set_post_ops(post_ops);
    if (user_scratchpad) attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    dnnl::matmul::primitive_desc pd(desc, attr, engine);
    std::fprintf(stderr, "oneDNN %s: %s\n", what.c_str(), pd.impl_info_str());
    return Primitive{pd, dnnl::matmul(pd)};
  } catch (const dnnl::error& e) {
    return absl::InternalError(
        absl::StrCat("oneDNN matmul ", what, ": ", e.what()));
  }
}

class OneDnn final : public GemmBackend {
 public:
  std::string Name() const override { return "onednn"; }
  std::string Description() const override {
    return absl::StrCat(Version(), " matmul (OpenMP)");
  }
  void SetThreads(int n) override { threads_ = n; }
  absl::Status Gemm(const GemmShape& s, const float* a, const float* b,
                    float beta, float* c) override {
    omp_set_num_threads(threads_);
    const Key key{s.trans_a, s.trans_b, s.m, s.n, s.k, beta != 0.0f, threads_};
    auto it = cache_.find(key);
    if (it == cache_.end()) {
      if (beta != 0.0f && beta != 1.0f) {
        return absl::InvalidArgumentError(
            absl::StrCat("oneDNN backend: beta must be 0 or 1, got ", beta));
      }
      dnnl::post_ops post_ops;
      if (beta != 0.0f) post_ops.append_sum(1.0f);
      const dnnl::matmul::desc desc(Matrix(s.m, s.k, s.trans_a),
                                    Matrix(s.k, s.n, s.trans_b),
                                    Matrix(s.m, s.n, false));
      absl::StatusOr<Primitive> p =
          Create(engine_, desc, post_ops,
                 absl::StrCat(s.trans_a ? "T" : "N", s.trans_b ? "T" : "N",
                              " m=", s.m, " n=", s.n, " k=", s.k,
                              " beta=", beta, " threads=", threads_));
      if (!p.ok()) return p.status();
      it = cache_.emplace(key, *std::move(p)).first;
    }
    return Execute(it->second.prim, engine_, stream_, it->second.pd, a, b,
                   nullptr, c);
  }

 private:
  using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, bool, int>;
  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream_{engine_};
  std::map<Key, Primitive> cache_;
  int threads_ = 1;
};

// rows x cols floats from src (row stride src_ld) to dst (row stride
// dst_ld).
void CopyRows(const float* src, int64_t src_ld, int64_t rows, int64_t cols,
              float* dst, int64_t dst_ld) {
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(dst + r * dst_ld, src + r * src_ld, cols * sizeof(float));
  }
}

// `rows` stored rows of `cols` floats at p (row stride ld): p itself when
// they are dense (cols == ld), else a dense copy in *copy.
const float* DenseRows(const float* p, int64_t ld, int64_t rows, int64_t cols,
                       std::vector<float>* copy) {
  if (cols == ld) return p;
  copy->resize(rows * cols);
  CopyRows(p, ld, rows, cols, copy->data(), cols);
  return copy->data();
}

// oneDNN on Sgemm's own tiling (kernels/blas.h GemmTiles): one
// single-threaded matmul a tile, the tiles on our compute pool, so the
// bits cannot depend on the thread count; the way the engine would call it.
// oneDNN 2.6 runs its brgemm kernels only on dense operands (a tile of a
// larger matrix falls back to gemm:jit), so a tile's operands that are not
// dense in place are copied into dense buffers (and C's tile back), as an
// engine would have to. Each tile has its own primitive, stream, buffers
// and user-managed scratchpad, so no two threads share any.
class OneDnnTiled final : public GemmBackend {
 public:
  std::string Name() const override { return "onednn-tiled"; }
  std::string Description() const override {
    return absl::StrCat(Version(),
                        " matmul, 1 thread a tile on kernels/blas.h's tiling");
  }
  void SetThreads(int n) override { SetBlasThreads(n); }
  absl::Status Gemm(const GemmShape& s, const float* a, const float* b,
                    float beta, float* c) override {
    if (beta != 0.0f && beta != 1.0f) {
      return absl::InvalidArgumentError(
          absl::StrCat("oneDNN backend: beta must be 0 or 1, got ", beta));
    }
    const GemmTileList tiles = GemmTiles(s.m, s.n, s.k);
    std::vector<Tile*> prims(tiles.size());
    omp_set_num_threads(1);
    for (size_t i = 0; i < tiles.size(); ++i) {
      const GemmTile& t = tiles[i];
      const Key key{s.trans_a,    s.trans_b,          s.m, s.n, s.k,
                    beta != 0.0f, static_cast<int>(i)};
      auto it = cache_.find(key);
      if (it == cache_.end()) {
        dnnl::post_ops post_ops;
        if (beta != 0.0f) post_ops.append_sum(1.0f);
        const dnnl::matmul::desc desc(Matrix(t.rows, s.k, s.trans_a),
                                      Matrix(s.k, t.cols, s.trans_b),
                                      Matrix(t.rows, t.cols, false));
        absl::StatusOr<Primitive> p = Create(
            engine_, desc, post_ops,
            absl::StrCat("tile ", i, " of ", s.trans_a ? "T" : "N",
                         s.trans_b ? "T" : "N", " m=", s.m, " n=", s.n,
                         " k=", s.k, " beta=", beta, ": ", t.rows, "x", t.cols),
            /*user_scratchpad=*/true);
        if (!p.ok()) return p.status();
        auto tile = std::make_unique<Tile>(Tile{*std::move(p), {engine_}, {}});
        tile->scratchpad = memory(tile->p.pd.scratchpad_desc(), engine_);
        it = cache_.emplace(key, std::move(tile)).first;
      }
      prims[i] = it->second.get();
    }
    std::mutex mu;
    absl::Status status;
    ParallelFor(static_cast<int>(tiles.size()), [&](int i) {
      absl::Status st = RunTile(s, tiles[i], a, b, beta != 0.0f, c, prims[i]);
      if (!st.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        status.Update(st);
      }
    });
    return status;
  }

 private:
  struct Tile {
    Primitive p;
    dnnl::stream stream;
    memory scratchpad;
    std::vector<float> a, b, c;  // dense copies, when needed
  };

  // One tile, C = op(A) op(B) (+ C when accumulate), on this thread.
  absl::Status RunTile(const GemmShape& s, const GemmTile& t, const float* a,
                       const float* b, bool accumulate, float* c, Tile* tile) {
    omp_set_num_threads(1);
    // op(A)'s rows [t.row, +t.rows): dense in place unless they are a
    // column range of a transposed A, or A has a longer leading dimension.
    const float* ta =
        s.trans_a
            ? DenseRows(a + t.row, s.lda(), s.k, t.rows, &tile->a)
            : DenseRows(a + t.row * s.lda(), s.lda(), t.rows, s.k, &tile->a);
    // op(B)'s columns [t.col, +t.cols), likewise.
    const float* tb =
        s.trans_b
            ? DenseRows(b + t.col * s.ldb(), s.ldb(), t.cols, s.k, &tile->b)
            : DenseRows(b + t.col, s.ldb(), s.k, t.cols, &tile->b);
    float* tc = c + t.row * s.ldc() + t.col;
    const bool c_dense = t.cols == s.ldc();
    if (!c_dense) {
      tile->c.resize(t.rows * t.cols);
      if (accumulate) {
        CopyRows(tc, s.ldc(), t.rows, t.cols, tile->c.data(), t.cols);
      }
    }
    try {
      const dnnl::matmul::primitive_desc& pd = tile->p.pd;
      tile->p.prim.execute(
          tile->stream,
          {{DNNL_ARG_SRC,
            memory(pd.src_desc(), engine_, const_cast<float*>(ta))},
           {DNNL_ARG_WEIGHTS,
            memory(pd.weights_desc(), engine_, const_cast<float*>(tb))},
           {DNNL_ARG_DST,
            memory(pd.dst_desc(), engine_, c_dense ? tc : tile->c.data())},
           {DNNL_ARG_SCRATCHPAD, tile->scratchpad}});
      tile->stream.wait();
    } catch (const dnnl::error& e) {
      return absl::InternalError(absl::StrCat("oneDNN matmul: ", e.what()));
    }
    if (!c_dense) CopyRows(tile->c.data(), t.cols, t.rows, t.cols, tc, s.ldc());
    return absl::OkStatus();
  }

  using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, bool, int>;
  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  std::map<Key, std::unique_ptr<Tile>> cache_;
};

class OneDnnLinearGelu final : public FusedLinearGelu {
 public:
  void SetThreads(int n) override { threads_ = n; }
  absl::Status Run(int64_t m, int64_t n, int64_t k, const float* a,
                   const float* w, const float* bias, float* out) override {
    omp_set_num_threads(threads_);
    const Key key{m, n, k, threads_};
    auto it = cache_.find(key);
    if (it == cache_.end()) {
      dnnl::post_ops post_ops;
      post_ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_gelu_erf, 0.0f,
                              0.0f);
      const dnnl::matmul::desc desc(
          Matrix(m, k, false), Matrix(k, n, /*transposed=*/true),
          memory::desc({1, n}, memory::data_type::f32, memory::dims{n, 1}),
          Matrix(m, n, false));
      absl::StatusOr<Primitive> p =
          Create(engine_, desc, post_ops,
                 absl::StrCat("NT+bias+gelu_erf m=", m, " n=", n, " k=", k,
                              " threads=", threads_));
      if (!p.ok()) return p.status();
      it = cache_.emplace(key, *std::move(p)).first;
    }
    return Execute(it->second.prim, engine_, stream_, it->second.pd, a, w, bias,
                   out);
  }

 private:
  using Key = std::tuple<int64_t, int64_t, int64_t, int>;
  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream_{engine_};
  std::map<Key, Primitive> cache_;
  int threads_ = 1;
};

// Constructs Impl (whose members create the CPU engine) as a T.
template <typename T, typename Impl>
absl::StatusOr<std::unique_ptr<T>> Make() {
  try {
    return std::unique_ptr<T>(new Impl());
  } catch (const dnnl::error& e) {
    return absl::FailedPreconditionError(
        absl::StrCat("oneDNN CPU engine: ", e.what()));
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<GemmBackend>> NewOneDnnBackend() {
  return Make<GemmBackend, OneDnn>();
}

absl::StatusOr<std::unique_ptr<GemmBackend>> NewOneDnnTiledBackend() {
  if (absl::Status status = BlasStatus(); !status.ok()) return status;
  return Make<GemmBackend, OneDnnTiled>();
}

absl::StatusOr<std::unique_ptr<FusedLinearGelu>> NewOneDnnFusedLinearGelu() {
  return Make<FusedLinearGelu, OneDnnLinearGelu>();
}

}  // namespace gemm_libs
}  // namespace trainyard
