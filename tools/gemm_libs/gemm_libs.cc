// Survey of the GEMM libraries Debian ships, and of our own packed GEMM
// (kernels/packed_gemm.h), on the MLP block's GEMMs (h=1024, ffn=4096) at
// microbatch sizes 256, 64 and 32, fp32, 1 and 2 threads, row-major as
// kernels/mlp_block.cc calls them. Prints markdown:
// GFLOP/s per library (median over rounds that alternate the libraries),
// the ratio to OpenBLAS's M=256 figure, a fused fc1 + bias + GELU row, and
// whether each library gives the same bits twice and for 1 and 2 threads.
//
// Usage: tools/gemm_libs/build.sh && tools/gemm_libs/gemm_libs [--rounds=N]
//   [--blocks=N]
// --blocks=N (default 1) gives each GEMM N blocks' weights (B of a forward
// or input gradient, the gradient C of a weight gradient; copies, so the
// bits checks are unchanged) and the timed calls cycle through them, so
// that with N * 16 MiB beyond the L3 the weights stream from memory as in
// a training step; with 1 they stay in cache.
// The bit hashes it prints identify each library's results: equal hashes in
// two runs mean the same bits across processes.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/activation.h"
#include "kernels/blas.h"
#include "tools/gemm_libs/gemm_backend.h"

namespace trainyard {
namespace gemm_libs {
namespace {

constexpr int64_t kHidden = 1024;
constexpr int64_t kFfn = 4096;
constexpr int64_t kRows[] = {256, 64, 32};
constexpr int kThreads[] = {1, 2};
// Floating-point work per timed measurement (reps = this / GEMM flops).
constexpr double kFlopsPerMeasurement = 4e9;

// One GEMM of the block's step at one microbatch size, with its inputs.
struct Case {
  std::string name;
  int64_t rows;
  GemmShape shape;
  float beta;
  std::vector<float> a, b, c0, c;
  // --blocks=N: N-1 more blocks' weight-sized operand (B of a forward or
  // input gradient, C of a weight gradient), which the timed calls cycle
  // through so that it streams from memory as in a step.
  std::vector<std::vector<float>> more;
};

std::vector<float> Random(int64_t n, std::mt19937* rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(*rng);
  return v;
}

// The six GEMMs of kernels/mlp_block.cc per block, for `rows` rows.
std::vector<Case> MakeCases() {
  std::mt19937 rng(21);
  std::vector<Case> cases;
  for (int64_t r : kRows) {
    const struct {
      const char* name;
      GemmShape shape;
      float beta;
    } defs[] = {
        {"fc1 fwd  [M,h]x[f,h]^T", {false, true, r, kFfn, kHidden}, 0.0f},
        {"fc2 fwd  [M,f]x[h,f]^T", {false, true, r, kHidden, kFfn}, 0.0f},
        {"fc2 dX   [M,h]x[h,f]", {false, false, r, kFfn, kHidden}, 0.0f},
        {"fc1 dX   [M,f]x[f,h]", {false, false, r, kHidden, kFfn}, 0.0f},
        {"fc2 dW   [M,h]^Tx[M,f] +=", {true, false, kHidden, kFfn, r}, 1.0f},
        {"fc1 dW   [M,f]^Tx[M,h] +=", {true, false, kFfn, kHidden, r}, 1.0f},
    };
    for (const auto& d : defs) {
      Case c{d.name, r, d.shape, d.beta, {}, {}, {}, {}, {}};
      c.a = Random(d.shape.a_size(), &rng);
      c.b = Random(d.shape.b_size(), &rng);
      c.c0 = Random(d.shape.c_size(), &rng);
      c.c = c.c0;
      cases.push_back(std::move(c));
    }
  }
  return cases;
}

// ||got - want|| / ||want|| over 512 sampled entries of C, want in float64.
double SampledError(const Case& c) {
  const GemmShape& s = c.shape;
  std::mt19937 rng(7);
  double num = 0, den = 0;
  for (int t = 0; t < 512; ++t) {
    const int64_t i = rng() % s.m, j = rng() % s.n;
    double want = c.beta * c.c0[i * s.n + j];
    for (int64_t p = 0; p < s.k; ++p) {
      const double a = s.trans_a ? c.a[p * s.lda() + i] : c.a[i * s.lda() + p];
      const double b = s.trans_b ? c.b[j * s.ldb() + p] : c.b[p * s.ldb() + j];
      want += a * b;
    }
    const double d = c.c[i * s.n + j] - want;
    num += d * d;
    den += want * want;
  }
  return std::sqrt(num / den);
}

// C from c0, then one GEMM.
absl::Status RunFresh(GemmBackend* lib, Case* c) {
  c->c = c->c0;
  return lib->Gemm(c->shape, c->a.data(), c->b.data(), c->beta, c->c.data());
}

struct Check {
  bool usable = true;
  std::string error;
  int cases = 0, same_twice = 0, same_across_threads = 0;
  uint64_t hash = 14695981039346656037ull;  // FNV-1a of all 1-thread results
  double max_error = 0;
};

// Runs every case twice with 1 thread and twice with 2; compares bits.
Check CheckBackend(GemmBackend* lib, std::vector<Case>* cases) {
  Check check;
  for (Case& c : *cases) {
    std::vector<float> runs[4];
    for (int r = 0; r < 4; ++r) {
      lib->SetThreads(r < 2 ? 1 : 2);
      if (absl::Status s = RunFresh(lib, &c); !s.ok()) {
        check.usable = false;
        check.error = std::string(s.message());
        return check;
      }
      runs[r] = c.c;
    }
    const size_t bytes = c.c.size() * sizeof(float);
    ++check.cases;
    check.same_twice += !std::memcmp(runs[0].data(), runs[1].data(), bytes) &&
                        !std::memcmp(runs[2].data(), runs[3].data(), bytes);
    check.same_across_threads +=
        !std::memcmp(runs[0].data(), runs[2].data(), bytes);
    check.max_error = std::max(check.max_error, SampledError(c));
    const auto* bytes_of =
        reinterpret_cast<const unsigned char*>(runs[0].data());
    for (size_t i = 0; i < bytes; ++i) {
      check.hash = (check.hash ^ bytes_of[i]) * 1099511628211ull;
    }
  }
  return check;
}

double Seconds(const std::function<void()>& fn, int reps, int warmups = 1) {
  // Warm-up: caches, primitives, JIT, thread pools, packs.
  for (int w = 0; w < warmups; ++w) fn();
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) fn();
  const std::chrono::duration<double> d =
      std::chrono::steady_clock::now() - start;
  return d.count() / reps;
}

int Reps(double flops) {
  return std::max(1, static_cast<int>(kFlopsPerMeasurement / flops));
}

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return absl::StrCat(one, " ", five, " ", fifteen);
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model, flags;
  while (std::getline(in, line)) {
    if (model.empty() && line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
    }
    if (flags.empty() && line.rfind("flags", 0) == 0) flags = line + " ";
  }
  std::string isa;
  for (const char* f : {"avx2", "fma", "avx512f", "avx512bw", "avx512vl"}) {
    if (flags.find(absl::StrCat(" ", f, " ")) != std::string::npos) {
      absl::StrAppend(&isa, isa.empty() ? "" : " ", f);
    }
  }
  return absl::StrCat(model, " (", isa, ")");
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// fc1 forward with its bias and GELU: fused in oneDNN against GEMM + our
// separate BiasGeluForward pass, and against OpenBLAS with that pass as its
// epilogue on each block of C, as kernels/mlp_block.cc runs it (ours keep
// the pre-activation that backward needs; the fused primitive does not).
struct FusedBench {
  GemmBackend* openblas;
  GemmBackend* onednn;
  FusedLinearGelu* fused;
  std::vector<float> bias, pre, out;

  static constexpr const char* kVariants[] = {
      "oneDNN fused bias+GELU", "oneDNN matmul + BiasGeluForward",
      "OpenBLAS (ours) + BiasGeluForward",
      "OpenBLAS (ours), BiasGeluForward as its epilogue"};
  static constexpr int kNumVariants = std::size(kVariants);

  absl::Status Run(int variant, Case* c, int threads) {
    const GemmShape& s = c->shape;
    if (variant == 0) {
      fused->SetThreads(threads);
      return fused->Run(s.m, s.n, s.k, c->a.data(), c->b.data(), bias.data(),
                        out.data());
    }
    if (variant == 3) {
      SetBlasThreads(threads);
      float* p = pre.data();
      float* o = out.data();
      const float* b = bias.data();
      const int64_t n = s.n;
      return Sgemm(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0f, c->a.data(),
                   s.lda(), c->b.data(), s.ldb(), 0.0f, p, s.ldc(),
                   [=](int64_t row, int64_t rows, int64_t col, int64_t cols) {
                     for (int64_t r = row; r < row + rows; ++r) {
                       BiasGeluForward(1, cols, b + col, p + r * n + col,
                                       o + r * n + col);
                     }
                   });
    }
    GemmBackend* lib = variant == 1 ? onednn : openblas;
    lib->SetThreads(threads);
    absl::Status st = lib->Gemm(s, c->a.data(), c->b.data(), 0.0f, pre.data());
    BiasGeluForward(s.m, s.n, bias.data(), pre.data(), out.data());
    return st;
  }

  // ||fused - unfused|| / ||unfused|| on one case, 2 threads.
  absl::StatusOr<double> Difference(Case* c) {
    RETURN_IF_ERROR(Run(2, c, 2));
    const std::vector<float> want = out;
    RETURN_IF_ERROR(Run(0, c, 2));
    double num = 0, den = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      num += (out[i] - want[i]) * double{out[i] - want[i]};
      den += want[i] * double{want[i]};
    }
    return std::sqrt(num / den);
  }
};

using Timings = std::map<std::string, std::vector<double>>;

std::string Key(const std::string& what, size_t index, int threads) {
  return absl::StrCat(what, "|", index, "|", threads);
}

// One round: every case at both thread counts, the libraries alternating
// (their order rotated by the round, so none always runs first).
absl::Status Round(int round, const std::vector<GemmBackend*>& libs,
                   std::vector<Case>* cases, FusedBench* fused,
                   Timings* seconds) {
  for (int threads : kThreads) {
    for (size_t i = 0; i < cases->size(); ++i) {
      Case& c = (*cases)[i];
      const bool weight_gradient = c.shape.trans_a;
      const int blocks = 1 + static_cast<int>(c.more.size());
      for (size_t j = 0; j < libs.size(); ++j) {
        GemmBackend* lib = libs[(j + round) % libs.size()];
        lib->SetThreads(threads);
        absl::Status status;
        int call = 0;
        const double s = Seconds(
            [&] {
              const int block = call++ % blocks;
              float* w = block == 0
                             ? (weight_gradient ? c.c.data() : c.b.data())
                             : c.more[block - 1].data();
              status.Update(lib->Gemm(c.shape, c.a.data(),
                                      weight_gradient ? c.b.data() : w, c.beta,
                                      weight_gradient ? w : c.c.data()));
            },
            std::max(blocks, Reps(c.shape.flops())), blocks);
        RETURN_IF_ERROR(status);
        (*seconds)[Key(lib->Name(), i, threads)].push_back(s);
      }
      if (i % 6 != 0 || fused == nullptr) continue;  // fc1 fwd only
      for (int v = 0; v < FusedBench::kNumVariants; ++v) {
        const int variant = (v + round) % FusedBench::kNumVariants;
        absl::Status status;
        const double s =
            Seconds([&] { status.Update(fused->Run(variant, &c, threads)); },
                    Reps(c.shape.flops()));
        RETURN_IF_ERROR(status);
        (*seconds)[Key(FusedBench::kVariants[variant], i, threads)].push_back(
            s);
      }
    }
  }
  return absl::OkStatus();
}

double GflopsOf(const Timings& seconds, const std::string& what, size_t i,
                int threads, double flops) {
  auto it = seconds.find(Key(what, i, threads));
  return it == seconds.end() ? 0 : flops / Median(it->second) / 1e9;
}

// Median GFLOP/s of the six GEMMs of `rows_index` together (total flops
// over the sum of the median times).
double StepGflops(const Timings& seconds, const std::vector<Case>& cases,
                  const std::string& what, size_t rows_index, int threads) {
  double flops = 0, time = 0;
  for (size_t g = 0; g < 6; ++g) {
    const size_t i = rows_index * 6 + g;
    auto it = seconds.find(Key(what, i, threads));
    if (it == seconds.end()) return 0;
    flops += cases[i].shape.flops();
    time += Median(it->second);
  }
  return flops / time / 1e9;
}

void PrintGemmTable(const Timings& seconds, const std::vector<Case>& cases,
                    const std::vector<GemmBackend*>& libs, int threads) {
  std::printf("\n%d thread%s: GFLOP/s (ratio to OpenBLAS-ours at M=256)\n\n",
              threads, threads == 1 ? "" : "s");
  std::printf("| GEMM | M |");
  for (GemmBackend* lib : libs) std::printf(" %s |", lib->Name().c_str());
  std::printf("\n|---|---|");
  for (size_t j = 0; j < libs.size(); ++j) std::printf("---|");
  std::printf("\n");
  const auto cell = [](double g, double ref) {
    std::printf(" %.1f (%.2f) |", g, ref > 0 ? g / ref : 0);
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const double flops = cases[i].shape.flops();
    const double ref = GflopsOf(seconds, "openblas", i % 6, threads,
                                cases[i % 6].shape.flops());
    std::printf("| %s | %lld |", cases[i].name.c_str(),
                static_cast<long long>(cases[i].rows));
    for (GemmBackend* lib : libs) {
      cell(GflopsOf(seconds, lib->Name(), i, threads, flops), ref);
    }
    std::printf("\n");
  }
  for (size_t r = 0; r < std::size(kRows); ++r) {
    const double ref = StepGflops(seconds, cases, "openblas", 0, threads);
    std::printf("| **all six** | %lld |", static_cast<long long>(kRows[r]));
    for (GemmBackend* lib : libs) {
      cell(StepGflops(seconds, cases, lib->Name(), r, threads), ref);
    }
    std::printf("\n");
  }
}

void PrintFusedTable(const Timings& seconds, const std::vector<Case>& cases) {
  std::printf(
      "\nfc1 forward + bias + GELU(erf), ms per call (GEMM GFLOP/s)\n\n"
      "| variant | threads | M=256 | M=64 | M=32 |\n|---|---|---|---|---|\n");
  for (const char* variant : FusedBench::kVariants) {
    for (int threads : kThreads) {
      std::printf("| %s | %d |", variant, threads);
      for (size_t r = 0; r < std::size(kRows); ++r) {
        const size_t i = r * 6;
        auto it = seconds.find(Key(variant, i, threads));
        if (it == seconds.end()) {
          std::printf(" - |");
          continue;
        }
        const double s = Median(it->second);
        std::printf(" %.2f (%.1f) |", s * 1e3,
                    cases[i].shape.flops() / s / 1e9);
      }
      std::printf("\n");
    }
  }
}

}  // namespace
}  // namespace gemm_libs
}  // namespace trainyard

namespace trainyard {
namespace gemm_libs {
namespace {

struct Backends {
  std::vector<std::unique_ptr<GemmBackend>> owned;
  std::vector<GemmBackend*> usable;
  std::unique_ptr<FusedLinearGelu> fused;
};

// Creates every backend; prints the ones that cannot load and why.
Backends LoadBackends() {
  Backends b;
  using Factory = std::function<absl::StatusOr<std::unique_ptr<GemmBackend>>()>;
  const std::pair<const char*, Factory> factories[] = {
      {"openblas", NewOpenBlasTiledBackend},
      {"openblas-mt", NewOpenBlasNativeBackend},
      {"blis", NewBlisBackend},
      {"onednn", NewOneDnnBackend},
      {"onednn-tiled", NewOneDnnTiledBackend},
      {"libxsmm", [] { return NewLibxsmmBackend(false); }},
      {"libxsmm-packW", [] { return NewLibxsmmBackend(true); }},
      {"packed", [] { return NewPackedBackend(true); }},
      {"packed-stream", [] { return NewPackedBackend(false); }},
  };
  for (const auto& [name, factory] : factories) {
    absl::StatusOr<std::unique_ptr<GemmBackend>> lib = factory();
    if (!lib.ok()) {
      std::printf("- %s: UNUSABLE: %s\n", name,
                  std::string(lib.status().message()).c_str());
      continue;
    }
    b.owned.push_back(*std::move(lib));
  }
  absl::StatusOr<std::unique_ptr<FusedLinearGelu>> fused =
      NewOneDnnFusedLinearGelu();
  if (fused.ok()) b.fused = *std::move(fused);
  return b;
}

// Checks each backend (bits, accuracy); keeps the usable ones.
void CheckAll(Backends* b, std::vector<Case>* cases) {
  std::printf(
      "\n| library | same bits twice | same bits 1 vs 2 threads | "
      "max sampled rel. error vs float64 | hash of the 1-thread bits |\n"
      "|---|---|---|---|---|\n");
  for (const auto& lib : b->owned) {
    const Check check = CheckBackend(lib.get(), cases);
    if (!check.usable) {
      std::printf("| %s | UNUSABLE: %s | | | |\n", lib->Name().c_str(),
                  check.error.c_str());
      continue;
    }
    std::printf("| %s | %d/%d GEMMs | %d/%d GEMMs | %.1e | %016llx |\n",
                lib->Name().c_str(), check.same_twice, check.cases,
                check.same_across_threads, check.cases, check.max_error,
                static_cast<unsigned long long>(check.hash));
    b->usable.push_back(lib.get());
  }
}

int Main(int argc, char** argv) {
  int rounds = 3, blocks = 1;
  for (int i = 1; i < argc; ++i) {
    if ((std::sscanf(argv[i], "--rounds=%d", &rounds) != 1 || rounds < 1) &&
        (std::sscanf(argv[i], "--blocks=%d", &blocks) != 1 || blocks < 1 ||
         blocks > 16)) {
      std::fprintf(stderr, "usage: %s [--rounds=N] [--blocks=1..16]\n",
                   argv[0]);
      return 2;
    }
  }
  std::printf(
      "CPU: %s\nload at start: %s\nOMP_WAIT_POLICY=%s\nblocks: %d (%s)\n\n"
      "Libraries:\n",
      CpuModel().c_str(), LoadAverage().c_str(), std::getenv("OMP_WAIT_POLICY"),
      blocks,
      blocks == 1 ? "each GEMM on the same operands: they stay in cache"
                  : "the weight-sized operand cycles over the blocks");
  Backends b = LoadBackends();
  for (const auto& lib : b.owned) {
    std::printf("- %s: %s\n", lib->Name().c_str(), lib->Description().c_str());
  }
  std::vector<Case> cases = MakeCases();
  CheckAll(&b, &cases);
  for (Case& c : cases) {
    const std::vector<float>& w = c.shape.trans_a ? c.c0 : c.b;
    c.more.assign(blocks - 1, w);
  }
  if (b.usable.empty() || b.usable[0]->Name() != "openblas") {
    std::printf("OpenBLAS (the reference) is unusable\n");
    return 1;
  }
  std::unique_ptr<FusedBench> fused;
  GemmBackend* onednn = nullptr;
  for (GemmBackend* lib : b.usable) {
    if (lib->Name() == "onednn") onednn = lib;
  }
  if (onednn != nullptr && b.fused != nullptr) {
    fused.reset(new FusedBench{b.usable[0], onednn, b.fused.get(),
                               std::vector<float>(kFfn, 0.01f),
                               std::vector<float>(kRows[0] * kFfn),
                               std::vector<float>(kRows[0] * kFfn)});
    absl::StatusOr<double> diff = fused->Difference(&cases[0]);
    std::printf("\nfused vs unfused fc1+bias+GELU (M=256): %s\n",
                diff.ok() ? absl::StrCat("rel. diff ", *diff).c_str()
                          : std::string(diff.status().message()).c_str());
  }
  Timings seconds;
  for (int r = 0; r < rounds; ++r) {
    if (absl::Status s = Round(r, b.usable, &cases, fused.get(), &seconds);
        !s.ok()) {
      std::printf("round %d failed: %s\n", r, std::string(s.message()).c_str());
      return 1;
    }
    std::fprintf(stderr, "round %d done, load %s\n", r, LoadAverage().c_str());
  }
  for (int threads : kThreads)
    PrintGemmTable(seconds, cases, b.usable, threads);
  if (fused != nullptr) PrintFusedTable(seconds, cases);
  std::printf("\n%d rounds, median; load at end: %s\n", rounds,
              LoadAverage().c_str());
  return 0;
}

}  // namespace
}  // namespace gemm_libs
}  // namespace trainyard

int main(int argc, char** argv) {
  // OpenMP threads (oneDNN's, BLIS's, libxsmm's) spin after each call by
  // default, taking a core from whichever library runs next in this
  // process; PASSIVE makes them sleep at once. libgomp reads the variable
  // when it loads, before main: set it, then start again.
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    execv("/proc/self/exe", argv);
    std::perror("gemm_libs: execv /proc/self/exe (going on without PASSIVE)");
    setenv("OMP_WAIT_POLICY", "unset: the re-exec failed", 1);
  }
  return trainyard::gemm_libs::Main(argc, argv);
}
