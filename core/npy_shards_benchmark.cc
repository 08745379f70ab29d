// Cold-cache gathers from float16 npy shards: the time a batch of shuffled
// rows takes when none of its pages is in the page cache, as a training
// job's first epoch over data larger than memory sees it.
//
//   bazel run //core:npy_shards_benchmark -- DIR [GIB] [D] [BATCH] [BATCHES]
//       [warm]
//
// Writes GIB GiB (default 2) of float16 [rows, D] shards (D 1024, 64 MiB
// each) with int32 targets into DIR, unless they are there from an earlier
// run; then, per round, flushes and drops the page cache (needs root:
// `sync; echo 3 > /proc/sys/vm/drop_caches`), gathers BATCHES (200) batches
// of BATCH (256) rows (`warm`: the page cache kept, as the floor the
// copies, faults and page drops cost) drawn without repeats from a seeded
// shuffle, and prints one line: rows/s, MiB/s of feature bytes, the first
// batch's and the median batch's ms, and the MiB the process had read from the
// disk
// (/proc/self/io read_bytes: what the kernel read for it, read-ahead
// included).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "core/npy_shards.h"

namespace trainyard {
namespace {

constexpr int64_t kShardBytes = int64_t{64} << 20;

// A version 1.0 .npy header for `descr` and a 1-D or 2-D shape.
std::string Header(const std::string& descr, const std::string& shape) {
  std::string dict =
      absl::StrCat("{'descr': '", descr,
                   "', 'fortran_order': False, 'shape': ", shape, ", }");
  const size_t total = 10 + dict.size() + 1;
  dict.append((total + 63) / 64 * 64 - total, ' ');
  dict.push_back('\n');
  std::string out("\x93NUMPY\x01\x00", 8);
  out.push_back(static_cast<char>(dict.size() & 0xFF));
  out.push_back(static_cast<char>(dict.size() >> 8));
  return out + dict;
}

// Writes shard `s` of `rows` rows unless it exists: features hold the
// half-precision bits of row % 2048 (any pattern: only bytes move).
bool WriteShard(const std::string& x, const std::string& y, int64_t s,
                int64_t rows, int64_t d) {
  if (::access(x.c_str(), R_OK) == 0 && ::access(y.c_str(), R_OK) == 0) {
    return true;
  }
  std::ofstream xf(x, std::ios::binary), yf(y, std::ios::binary);
  xf << Header("<f2", absl::StrCat("(", rows, ", ", d, ")"));
  yf << Header("<i4", absl::StrCat("(", rows, ",)"));
  std::vector<uint16_t> row(d);
  for (int64_t r = 0; r < rows; ++r) {
    std::fill(row.begin(), row.end(),
              static_cast<uint16_t>(0x3C00 + (s * rows + r) % 2048));
    xf.write(reinterpret_cast<const char*>(row.data()), 2 * d);
    const int32_t label = static_cast<int32_t>(r % 10);
    yf.write(reinterpret_cast<const char*>(&label), 4);
  }
  return static_cast<bool>(xf) && static_cast<bool>(yf);
}

bool DropCaches() {
  ::sync();
  std::ofstream drop("/proc/sys/vm/drop_caches");
  drop << "3\n";
  return static_cast<bool>(drop);
}

// The bytes this process has caused to be read from storage.
int64_t ReadBytes() {
  std::ifstream io("/proc/self/io");
  std::string key;
  int64_t value = 0;
  while (io >> key >> value) {
    if (key == "read_bytes:") return value;
  }
  return -1;
}

int64_t Arg(int argc, char** argv, int i, int64_t fallback) {
  int64_t v = fallback;
  if (argc > i && !absl::SimpleAtoi(argv[i], &v)) {
    std::fprintf(stderr, "argument %d: not a number: %s\n", i, argv[i]);
    std::exit(2);
  }
  return v;
}

int Main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DIR [GIB] [D] [BATCH] [BATCHES] [warm]\n",
                 argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const int64_t gib = Arg(argc, argv, 2, 2), d = Arg(argc, argv, 3, 1024);
  const int64_t batch = Arg(argc, argv, 4, 256);
  const int64_t batches = Arg(argc, argv, 5, 200);
  const bool warm = argc > 6 && std::string(argv[6]) == "warm";
  const int64_t shard_rows = kShardBytes / (2 * d);
  const int64_t shards = (gib << 30) / kShardBytes;
  if (!CreateDirectories(dir).ok()) return 1;
  std::vector<std::string> xs, ys;
  for (int64_t s = 0; s < shards; ++s) {
    xs.push_back(JoinPath(dir, absl::StrCat("x-", s, ".npy")));
    ys.push_back(JoinPath(dir, absl::StrCat("y-", s, ".npy")));
    if (!WriteShard(xs.back(), ys.back(), s, shard_rows, d)) {
      std::fprintf(stderr, "%s: cannot write\n", xs.back().c_str());
      return 1;
    }
  }
  auto source = NpyShards::Open(xs, ys);
  if (!source.ok()) {
    std::fprintf(stderr, "%s\n",
                 std::string(source.status().message()).c_str());
    return 1;
  }
  std::vector<int64_t> order((*source)->num_rows());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(7));
  for (int round = 0; round < 3; ++round) {
    if (!warm && !DropCaches()) {
      std::fprintf(stderr, "cannot drop the page cache (not root?)\n");
      return 1;
    }
    const int64_t read_before = ReadBytes();
    std::vector<double> ms;
    for (int64_t b = 0; b < batches; ++b) {
      const auto first = order.begin() + (round * batches + b) * batch;
      const auto start = std::chrono::steady_clock::now();
      auto got = (*source)->Gather(std::vector<int64_t>(first, first + batch));
      if (!got.ok()) {
        std::fprintf(stderr, "%s\n",
                     std::string(got.status().message()).c_str());
        return 1;
      }
      ms.push_back(std::chrono::duration<double, std::milli>(
                       std::chrono::steady_clock::now() - start)
                       .count());
    }
    const double s = std::accumulate(ms.begin(), ms.end(), 0.0) / 1e3;
    const double first_ms = ms[0];
    std::sort(ms.begin(), ms.end());
    const double rows = static_cast<double>(batches * batch);
    std::printf(
        "%s gather: %lld batches of %lld rows, D=%lld float16, %lld GiB in "
        "%lld shards: %.0f rows/s, %.1f MiB/s; batch ms: first %.1f, median "
        "%.2f; read from disk %.0f MiB\n",
        warm ? "warm" : "cold", static_cast<long long>(batches),
        static_cast<long long>(batch), static_cast<long long>(d),
        static_cast<long long>(gib), static_cast<long long>(shards), rows / s,
        rows * 2 * d / s / (1 << 20), first_ms, ms[ms.size() / 2],
        static_cast<double>(ReadBytes() - read_before) / (1 << 20));
  }
  return 0;
}

}  // namespace
}  // namespace trainyard

int main(int argc, char** argv) { return trainyard::Main(argc, argv); }
