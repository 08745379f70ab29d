#include "engine/dataset.h"

#include <cmath>
#include <cstring>
#include <numeric>
#include <tuple>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/file_util.h"
#include "core/npy.h"
#include "core/random.h"
#include "core/status_macros.h"
#include "glog/logging.h"

namespace trainyard {
namespace {

// Synthetic data above this many floats is almost certainly a typo.
constexpr int64_t kMaxSyntheticElements = int64_t{1} << 30;

std::string Describe(const Tensor& t) {
  return absl::StrCat(ShapeToString(t.shape()), " ", DTypeName(t.dtype()));
}

absl::StatusOr<Dataset> LoadNpy(const trainyard::v1::NpySource& npy,
                                const std::string& base_dir) {
  if (npy.features().empty() || npy.targets().empty()) {
    return absl::InvalidArgumentError(
        "npy data source: both \"features\" and \"targets\" paths must be set");
  }
  auto resolve = [&](const std::string& p) {
    return p[0] == '/' ? p : JoinPath(base_dir, p);
  };
  const std::string fpath = resolve(npy.features());
  const std::string tpath = resolve(npy.targets());
  // Headers first: cheap, and a bad targets file fails before a large
  // features file is read.
  ASSIGN_OR_RETURN(NpyHeader fh, ReadNpyHeader(fpath));
  ASSIGN_OR_RETURN(NpyHeader th, ReadNpyHeader(tpath));
  if (fh.dtype != DType::kFloat32 || fh.shape.size() != 2 || fh.shape[0] < 1 ||
      fh.shape[1] < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        fpath, ": features must be float32 [N, D] with N, D >= 1, got ",
        ShapeToString(fh.shape), " ", DTypeName(fh.dtype)));
  }
  const bool class_ids =
      (th.dtype == DType::kInt32 || th.dtype == DType::kInt64) &&
      th.shape.size() == 1;
  const bool regression =
      th.dtype == DType::kFloat32 && th.shape.size() == 2 && th.shape[1] >= 1;
  if (!class_ids && !regression) {
    return absl::InvalidArgumentError(
        absl::StrCat(tpath,
                     ": targets must be int32/int64 [N] (class ids) or float32 "
                     "[N, K] (regression), got ",
                     ShapeToString(th.shape), " ", DTypeName(th.dtype)));
  }
  if (th.shape[0] != fh.shape[0]) {
    return absl::InvalidArgumentError(
        absl::StrCat("npy data source: features ", fpath, " has ", fh.shape[0],
                     " rows but targets ", tpath, " has ", th.shape[0]));
  }
  Dataset d;
  ASSIGN_OR_RETURN(d.features, ReadNpy(fpath));
  ASSIGN_OR_RETURN(d.targets, ReadNpy(tpath));
  // The files could have changed between header and full read.
  if (d.features.shape() != fh.shape || d.targets.shape() != th.shape ||
      d.features.dtype() != fh.dtype || d.targets.dtype() != th.dtype) {
    return absl::AbortedError(absl::StrCat("npy data source: ", fpath, " or ",
                                           tpath, " changed while loading"));
  }
  d.description =
      absl::StrCat("npy features ", fpath, " ", Describe(d.features),
                   ", targets ", tpath, " ", Describe(d.targets));
  return d;
}

// Every file of `entries` (paths or glob patterns, relative to base_dir),
// each entry's sorted by name, in entry order.
absl::StatusOr<std::vector<std::string>> ShardFiles(
    const google::protobuf::RepeatedPtrField<std::string>& entries,
    const std::string& base_dir, const char* what) {
  std::vector<std::string> files;
  for (const std::string& entry : entries) {
    const std::string pattern =
        !entry.empty() && entry[0] == '/' ? entry : JoinPath(base_dir, entry);
    absl::StatusOr<std::vector<std::string>> matched = ExpandGlob(pattern);
    if (!matched.ok()) return Prefixed(matched.status(), what);
    files.insert(files.end(), matched->begin(), matched->end());
  }
  return files;
}

absl::StatusOr<Dataset> LoadNpyShards(
    const trainyard::v1::NpyShardsSource& source, const std::string& base_dir) {
  ASSIGN_OR_RETURN(
      std::vector<std::string> features,
      ShardFiles(source.features(), base_dir, "npy_shards.features: "));
  ASSIGN_OR_RETURN(
      std::vector<std::string> targets,
      ShardFiles(source.targets(), base_dir, "npy_shards.targets: "));
  if (features.size() != targets.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("npy_shards: features name ", features.size(),
                     " files but targets name ", targets.size(),
                     ": the k-th of each are a pair"));
  }
  if (!source.features_dtype().empty() &&
      source.features_dtype() != "bfloat16") {
    return absl::InvalidArgumentError(absl::StrCat(
        "npy_shards.features_dtype: must be \"\" or \"bfloat16\", got \"",
        absl::CEscape(source.features_dtype().substr(0, 32)), "\""));
  }
  NpyShardsOptions options;
  options.bfloat16_features = source.features_dtype() == "bfloat16";
  Dataset d;
  ASSIGN_OR_RETURN(d.shards, NpyShards::Open(features, targets, options));
  d.description = absl::StrCat(
      "npy shards: ", features.size(), " pairs from ", features.front(), ", ",
      d.shards->num_rows(), " rows of ", d.shards->num_features(), " features");
  return d;
}

absl::Status CheckSynthetic(const trainyard::v1::SyntheticSource& s) {
  auto bad = [&](absl::string_view field, absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "synthetic data source \"", s.kind(), "\": ", field, " ", why));
  };
  if (s.num_samples() < 1) {
    return bad("num_samples",
               absl::StrCat("must be >= 1, got ", s.num_samples()));
  }
  if (s.num_features() < 1) {
    return bad("num_features",
               absl::StrCat("must be >= 1, got ", s.num_features()));
  }
  if (s.num_outputs() < 1) {
    return bad("num_outputs",
               absl::StrCat("must be >= 1, got ", s.num_outputs()));
  }
  if (!(s.noise() >= 0) || !std::isfinite(s.noise())) {
    return bad("noise",
               absl::StrCat("must be finite and >= 0, got ", s.noise()));
  }
  const double elems =
      static_cast<double>(s.num_samples()) *
      static_cast<double>(std::max(s.num_features(), s.num_outputs()));
  if (elems > static_cast<double>(kMaxSyntheticElements)) {
    return bad("num_samples", absl::StrCat("* width = ", elems,
                                           " values exceeds the limit of ",
                                           kMaxSyntheticElements));
  }
  const double params = static_cast<double>(s.num_outputs()) *
                        static_cast<double>(s.num_features());
  if (params > static_cast<double>(kMaxSyntheticElements)) {
    return bad("num_outputs", absl::StrCat("* num_features = ", params,
                                           " values exceeds the limit of ",
                                           kMaxSyntheticElements));
  }
  return absl::OkStatus();
}

Dataset TeacherRegression(int64_t n, int64_t d, int64_t k, double noise,
                          uint64_t seed, uint64_t sample_offset) {
  const int64_t h = kTeacherHiddenWidth;
  Dataset out;
  out.features = Tensor::Empty(DType::kFloat32, {n, d});
  out.targets = Tensor::Empty(DType::kFloat32, {n, k});
  float* x = out.features.data<float>();
  Rng feature_rng(seed, kSyntheticFeatureStream + sample_offset);
  for (int64_t i = 0; i < n * d; ++i) {
    x[i] = static_cast<float>(feature_rng.Normal());
  }
  Rng teacher(seed, kSyntheticTeacherStream);
  std::vector<double> w1(h * d), b1(h), w2(k * h);
  const double s1 = 1.0 / std::sqrt(static_cast<double>(d));
  const double s2 = 1.0 / std::sqrt(static_cast<double>(h));
  for (double& v : w1) v = teacher.Normal() * s1;
  for (double& v : b1) v = teacher.Normal() * 0.5;
  for (double& v : w2) v = teacher.Normal() * s2;
  Rng noise_rng(seed, kSyntheticNoiseStream + sample_offset);
  float* y = out.targets.data<float>();
  std::vector<double> hidden(h);
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * d;
    for (int64_t j = 0; j < h; ++j) {
      double acc = b1[j];
      for (int64_t c = 0; c < d; ++c) acc += w1[j * d + c] * xi[c];
      hidden[j] = std::tanh(acc);
    }
    for (int64_t o = 0; o < k; ++o) {
      double acc = 0;
      for (int64_t j = 0; j < h; ++j) acc += w2[o * h + j] * hidden[j];
      y[i * k + o] = static_cast<float>(acc + noise * noise_rng.Normal());
    }
  }
  return out;
}

Dataset GaussianBlobs(int64_t n, int64_t d, int64_t k, double noise,
                      uint64_t seed, uint64_t sample_offset) {
  Dataset out;
  out.features = Tensor::Empty(DType::kFloat32, {n, d});
  out.targets = Tensor::Empty(DType::kInt64, {n});
  Rng center_rng(seed, kSyntheticTeacherStream);
  std::vector<double> centers(k * d);
  for (double& v : centers) v = 3.0 * center_rng.Normal();
  Rng rng(seed, kSyntheticFeatureStream + sample_offset);
  float* x = out.features.data<float>();
  int64_t* labels = out.targets.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t label = static_cast<int64_t>(rng.Below(k));
    labels[i] = label;
    for (int64_t j = 0; j < d; ++j) {
      x[i * d + j] =
          static_cast<float>(centers[label * d + j] + noise * rng.Normal());
    }
  }
  return out;
}

absl::StatusOr<Dataset> LoadSynthetic(const trainyard::v1::SyntheticSource& s,
                                      uint64_t default_seed, DataSplit split) {
  if (s.kind() != "teacher_regression" && s.kind() != "gaussian_blobs") {
    return absl::InvalidArgumentError(absl::StrCat(
        "synthetic data source: unknown kind \"", s.kind(),
        "\" (expected \"teacher_regression\" or \"gaussian_blobs\")"));
  }
  RETURN_IF_ERROR(CheckSynthetic(s));
  const uint64_t seed = s.seed() != 0 ? s.seed() : default_seed;
  const uint64_t offset =
      split == DataSplit::kEval ? kSyntheticEvalStreamOffset : 0;
  Dataset d = s.kind() == "teacher_regression"
                  ? TeacherRegression(s.num_samples(), s.num_features(),
                                      s.num_outputs(), s.noise(), seed, offset)
                  : GaussianBlobs(s.num_samples(), s.num_features(),
                                  s.num_outputs(), s.noise(), seed, offset);
  d.description = absl::StrFormat(
      "synthetic %s num_samples=%d num_features=%d num_outputs=%d noise=%g "
      "seed=%d",
      s.kind(), s.num_samples(), s.num_features(), s.num_outputs(), s.noise(),
      seed);
  return d;
}

}  // namespace

absl::StatusOr<Dataset> LoadDataSource(const trainyard::v1::DataSource& source,
                                       const std::string& base_dir,
                                       uint64_t default_seed, DataSplit split) {
  switch (source.source_case()) {
    case trainyard::v1::DataSource::kNpy:
      return LoadNpy(source.npy(), base_dir);
    case trainyard::v1::DataSource::kSynthetic:
      return LoadSynthetic(source.synthetic(), default_seed, split);
    case trainyard::v1::DataSource::kNpyShards:
      return LoadNpyShards(source.npy_shards(), base_dir);
    case trainyard::v1::DataSource::SOURCE_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      "data source is empty: set \"npy\", \"npy_shards\" or \"synthetic\"");
}

absl::StatusOr<std::pair<Dataset, Dataset>> SplitTail(const Dataset& data,
                                                      double fraction) {
  const int64_t n = data.num_rows();
  if (!(fraction > 0 && fraction < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("eval_fraction must be in (0, 1), got ", fraction));
  }
  // floor, as docs/SPEC.md and the spec validation (plan/data_check.cc) say.
  const int64_t n_eval =
      static_cast<int64_t>(std::floor(static_cast<double>(n) * fraction));
  if (n_eval < 1 || n_eval >= n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "eval_fraction ", fraction, " of ", n, " rows leaves ", n - n_eval,
        " train and ", n_eval, " eval rows; each needs at least 1"));
  }
  const int64_t cut = n - n_eval;
  Dataset train, eval;
  train.description = absl::StrCat(data.description, " rows [0, ", cut, ")");
  eval.description =
      absl::StrCat(data.description, " rows [", cut, ", ", n, ")");
  if (!data.in_memory()) {
    train.shards = data.shards->Slice(0, cut);
    eval.shards = data.shards->Slice(cut, n);
  } else {
    train.features = data.features.Rows(0, cut);
    train.targets = data.targets.Rows(0, cut);
    eval.features = data.features.Rows(cut, n);
    eval.targets = data.targets.Rows(cut, n);
  }
  return std::make_pair(std::move(train), std::move(eval));
}

absl::StatusOr<Dataset> Gather(const Dataset& data,
                               const std::vector<int64_t>& rows) {
  if (!data.in_memory()) {
    Dataset out;
    out.description = data.description;
    ASSIGN_OR_RETURN(std::tie(out.features, out.targets),
                     data.shards->Gather(rows));
    return out;
  }
  const int64_t n = data.num_rows();
  const int64_t b = static_cast<int64_t>(rows.size());
  Shape fshape = data.features.shape();
  Shape tshape = data.targets.shape();
  fshape[0] = b;
  tshape[0] = b;
  Dataset out;
  out.features = Tensor::Empty(data.features.dtype(), fshape);
  out.targets = Tensor::Empty(data.targets.dtype(), tshape);
  out.description = data.description;
  const size_t frow = n == 0 ? 0 : data.features.nbytes() / n;
  const size_t trow = n == 0 ? 0 : data.targets.nbytes() / n;
  const char* fsrc = static_cast<const char*>(data.features.raw_data());
  const char* tsrc = static_cast<const char*>(data.targets.raw_data());
  char* fdst = static_cast<char*>(out.features.raw_data());
  char* tdst = static_cast<char*>(out.targets.raw_data());
  for (int64_t i = 0; i < b; ++i) {
    const int64_t r = rows[i];
    CHECK(r >= 0 && r < n) << "row " << r << " out of range [0, " << n << ")";
    std::memcpy(fdst + i * frow, fsrc + r * frow, frow);
    std::memcpy(tdst + i * trow, tsrc + r * trow, trow);
  }
  return out;
}

BatchSampler::BatchSampler(int64_t num_rows, int64_t batch_size, bool shuffle,
                           uint64_t seed)
    : num_rows_(num_rows),
      batch_size_(batch_size),
      shuffle_(shuffle),
      seed_(seed) {
  CHECK_GE(num_rows, 1);
  CHECK_GE(batch_size, 1);
}

std::vector<int64_t> BatchSampler::Next() {
  std::vector<int64_t> rows(batch_size_);
  for (int64_t i = 0; i < batch_size_; ++i) rows[i] = RowAt(position_ + i);
  position_ += batch_size_;
  return rows;
}

void BatchSampler::Seek(int64_t position) {
  CHECK_GE(position, 0);
  position_ = position;
}

int64_t BatchSampler::RowAt(int64_t position) const {
  const int64_t epoch = position / num_rows_;
  const int64_t index = position % num_rows_;
  if (!shuffle_) return index;
  return ShuffledRow(index, num_rows_, seed_, static_cast<uint64_t>(epoch));
}

namespace {

uint64_t Mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

int64_t ShuffledRow(int64_t index, int64_t n, uint64_t seed, uint64_t epoch) {
  CHECK(n >= 1 && n <= (int64_t{1} << 62) && index >= 0 && index < n)
      << index << " of " << n;
  int h = 1;
  while ((uint64_t{1} << (2 * h)) < static_cast<uint64_t>(n)) ++h;
  const uint64_t mask = (uint64_t{1} << h) - 1;
  const uint64_t base = Mix64(seed ^ Mix64(kShuffleStreamBase + epoch));
  uint64_t key[4];
  for (int r = 0; r < 4; ++r) key[r] = Mix64(base + r);
  uint64_t x = static_cast<uint64_t>(index);
  do {
    uint64_t left = x >> h, right = x & mask;
    for (int r = 0; r < 4; ++r) {
      const uint64_t next = left ^ (Mix64(right ^ key[r]) & mask);
      left = right;
      right = next;
    }
    x = (left << h) | right;
  } while (x >= static_cast<uint64_t>(n));
  return static_cast<int64_t>(x);
}

}  // namespace trainyard
