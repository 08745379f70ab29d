#include "engine/dataset.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/file_util.h"
#include "core/npy.h"
#include "core/random.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using trainyard::v1::DataSource;

std::string TmpDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

DataSource Npy(const std::string& features, const std::string& targets) {
  DataSource s;
  s.mutable_npy()->set_features(features);
  s.mutable_npy()->set_targets(targets);
  return s;
}

DataSource Synthetic(const std::string& kind, int64_t n, int64_t d, int64_t k,
                     double noise, uint64_t seed) {
  DataSource s;
  auto* syn = s.mutable_synthetic();
  syn->set_kind(kind);
  syn->set_num_samples(n);
  syn->set_num_features(d);
  syn->set_num_outputs(k);
  syn->set_noise(noise);
  syn->set_seed(seed);
  return s;
}

bool SameBytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// --- npy sources ---

TEST(LoadDataSourceTest, DigitsWithRelativePaths) {
  auto d = LoadDataSource(
      Npy("digits/train_features.npy", "digits/train_labels.npy"), "examples",
      1);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->features.shape(), (Shape{1437, 64}));
  EXPECT_EQ(d->targets.shape(), (Shape{1437}));
  EXPECT_EQ(d->targets.dtype(), DType::kInt64);
  const int64_t* labels = d->targets.data<int64_t>();
  EXPECT_THAT(std::vector<int64_t>(labels, labels + 8),
              ElementsAre(5, 0, 3, 6, 1, 0, 6, 7));  // as numpy reads them
  const float* x = d->features.data<float>();
  EXPECT_EQ(x[2], 0.5f);
  EXPECT_EQ(x[3], 0.9375f);
  double sum = 0;
  for (int64_t i = 0; i < d->features.numel(); ++i) {
    ASSERT_GE(x[i], 0.f);
    ASSERT_LE(x[i], 1.f);
    sum += x[i];
  }
  EXPECT_EQ(sum, 28043.625);
  EXPECT_THAT(d->description, HasSubstr("examples/digits/train_features.npy"));
  EXPECT_THAT(d->description, HasSubstr("[1437, 64] float32"));

  auto eval = LoadDataSource(
      Npy("digits/eval_features.npy", "digits/eval_labels.npy"), "examples", 1);
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_EQ(eval->num_rows(), 360);
}

class NpyErrorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = JoinPath(TmpDir(), "npy_errors");
    ASSERT_TRUE(CreateDirectories(dir_).ok());
    Write("x.npy", Tensor::Zeros(DType::kFloat32, {4, 3}));
    Write("y.npy", Tensor::Zeros(DType::kInt64, {4}));
    Write("y5.npy", Tensor::Zeros(DType::kInt64, {5}));
    Write("yreg.npy", Tensor::Zeros(DType::kFloat32, {4, 2}));
    Write("y1d_float.npy", Tensor::Zeros(DType::kFloat32, {4}));
    Write("x_int.npy", Tensor::Zeros(DType::kInt64, {4, 3}));
    Write("x1d.npy", Tensor::Zeros(DType::kFloat32, {4}));
  }
  void Write(const std::string& name, const Tensor& t) {
    ASSERT_TRUE(WriteNpy(JoinPath(dir_, name), t).ok());
  }
  std::string P(const std::string& name) { return JoinPath(dir_, name); }
  std::string dir_;
};

TEST_F(NpyErrorsTest, AbsolutePathsAndRegressionTargets) {
  auto d = LoadDataSource(Npy(P("x.npy"), P("yreg.npy")), "/elsewhere", 1);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->targets.shape(), (Shape{4, 2}));
}

TEST_F(NpyErrorsTest, MissingFileNamesIt) {
  auto d = LoadDataSource(Npy("nope.npy", "y.npy"), dir_, 1);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(d.status().message(), HasSubstr(P("nope.npy")));
}

TEST_F(NpyErrorsTest, RowMismatchNamesBothFiles) {
  auto d = LoadDataSource(Npy("x.npy", "y5.npy"), dir_, 1);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(d.status().message(),
              HasSubstr("features " + P("x.npy") + " has 4 rows but targets " +
                        P("y5.npy") + " has 5"));
}

TEST_F(NpyErrorsTest, WrongFeatureDTypeOrRank) {
  auto d = LoadDataSource(Npy("x_int.npy", "y.npy"), dir_, 1);
  EXPECT_THAT(d.status().message(), HasSubstr(P("x_int.npy")));
  EXPECT_THAT(d.status().message(),
              HasSubstr("features must be float32 [N, D] with N, D >= 1, got "
                        "[4, 3] int64"));
  d = LoadDataSource(Npy("x1d.npy", "y.npy"), dir_, 1);
  EXPECT_THAT(d.status().message(), HasSubstr("got [4] float32"));
}

TEST_F(NpyErrorsTest, WrongTargetShape) {
  auto d = LoadDataSource(Npy("x.npy", "y1d_float.npy"), dir_, 1);
  EXPECT_THAT(d.status().message(), HasSubstr(P("y1d_float.npy")));
  EXPECT_THAT(d.status().message(),
              HasSubstr("targets must be int32/int64 [N]"));
}

TEST_F(NpyErrorsTest, EmptySourceAndMissingPaths) {
  EXPECT_THAT(LoadDataSource(DataSource(), dir_, 1).status().message(),
              HasSubstr("data source is empty"));
  EXPECT_THAT(LoadDataSource(Npy("x.npy", ""), dir_, 1).status().message(),
              HasSubstr("\"targets\""));
}

// --- synthetic sources ---

TEST(SyntheticTest, TeacherRegressionIsDeterministicAndSeeded) {
  auto a = LoadDataSource(Synthetic("teacher_regression", 200, 5, 3, 0.1, 7),
                          "", 99);
  auto b = LoadDataSource(Synthetic("teacher_regression", 200, 5, 3, 0.1, 7),
                          "", 12345);
  auto c = LoadDataSource(Synthetic("teacher_regression", 200, 5, 3, 0.1, 8),
                          "", 99);
  // seed 0 falls back to the default seed.
  auto d =
      LoadDataSource(Synthetic("teacher_regression", 200, 5, 3, 0.1, 0), "", 7);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok() && d.ok()) << a.status();
  EXPECT_EQ(a->features.shape(), (Shape{200, 5}));
  EXPECT_EQ(a->targets.shape(), (Shape{200, 3}));
  EXPECT_EQ(a->targets.dtype(), DType::kFloat32);
  EXPECT_TRUE(SameBytes(a->features, b->features));
  EXPECT_TRUE(SameBytes(a->targets, b->targets));
  EXPECT_TRUE(SameBytes(a->features, d->features));
  EXPECT_TRUE(SameBytes(a->targets, d->targets));
  EXPECT_FALSE(SameBytes(a->features, c->features));
  EXPECT_THAT(a->description, HasSubstr("teacher_regression"));
  EXPECT_THAT(a->description, HasSubstr("seed=7"));
}

TEST(SyntheticTest, TeacherRegressionFollowsDocumentedAlgorithm) {
  const int64_t n = 50, dim = 4, k = 2, h = kTeacherHiddenWidth;
  const double noise = 0.25;
  const uint64_t seed = 31;
  auto got = LoadDataSource(
      Synthetic("teacher_regression", n, dim, k, noise, seed), "", 1);
  ASSERT_TRUE(got.ok()) << got.status();
  // An independent re-implementation from the header comment.
  Rng xr(seed, kSyntheticFeatureStream), tr(seed, kSyntheticTeacherStream),
      nr(seed, kSyntheticNoiseStream);
  std::vector<float> x(n * dim);
  for (float& v : x) v = static_cast<float>(xr.Normal());
  std::vector<double> w1(h * dim), b1(h), w2(k * h);
  for (double& v : w1) v = tr.Normal() / std::sqrt(double(dim));
  for (double& v : b1) v = tr.Normal() * 0.5;
  for (double& v : w2) v = tr.Normal() / std::sqrt(double(h));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < dim; ++c) {
      ASSERT_EQ(got->features.data<float>()[i * dim + c], x[i * dim + c]);
    }
    std::vector<double> hid(h);
    for (int64_t j = 0; j < h; ++j) {
      double a = b1[j];
      for (int64_t c = 0; c < dim; ++c) a += w1[j * dim + c] * x[i * dim + c];
      hid[j] = std::tanh(a);
    }
    for (int64_t o = 0; o < k; ++o) {
      double y = 0;
      for (int64_t j = 0; j < h; ++j) y += w2[o * h + j] * hid[j];
      y += noise * nr.Normal();
      ASSERT_EQ(got->targets.data<float>()[i * k + o], static_cast<float>(y))
          << "row " << i << " output " << o;
    }
  }
}

TEST(SyntheticTest, TeacherFeaturesAreStandardNormal) {
  auto d =
      LoadDataSource(Synthetic("teacher_regression", 4000, 8, 1, 0, 3), "", 1);
  ASSERT_TRUE(d.ok());
  double sum = 0, sq = 0;
  const int64_t m = d->features.numel();
  for (int64_t i = 0; i < m; ++i) {
    sum += d->features.data<float>()[i];
    sq += d->features.data<float>()[i] * d->features.data<float>()[i];
  }
  EXPECT_NEAR(sum / m, 0.0, 0.03);
  EXPECT_NEAR(sq / m, 1.0, 0.05);
}

TEST(SyntheticTest, GaussianBlobsClusterAroundClassCenters) {
  const int64_t n = 3000, dim = 6, k = 4;
  auto d =
      LoadDataSource(Synthetic("gaussian_blobs", n, dim, k, 0.5, 11), "", 1);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->targets.dtype(), DType::kInt64);
  EXPECT_EQ(d->targets.shape(), (Shape{n}));
  // Reproduce the centers from the documented stream.
  Rng centers_rng(11, kSyntheticTeacherStream);
  std::vector<double> centers(k * dim);
  for (double& v : centers) v = 3.0 * centers_rng.Normal();
  std::vector<int64_t> count(k, 0);
  double sq = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t label = d->targets.data<int64_t>()[i];
    ASSERT_GE(label, 0);
    ASSERT_LT(label, k);
    ++count[label];
    for (int64_t j = 0; j < dim; ++j) {
      double diff =
          d->features.data<float>()[i * dim + j] - centers[label * dim + j];
      sq += diff * diff;
    }
  }
  // Per-coordinate spread around the own center is the noise (0.5).
  EXPECT_NEAR(std::sqrt(sq / (n * dim)), 0.5, 0.02);
  for (int64_t c = 0; c < k; ++c) EXPECT_NEAR(count[c], n / k, 120) << c;
}

TEST(SyntheticTest, BadParametersNameTheField) {
  struct Case {
    DataSource source;
    std::string expect;
  };
  std::vector<Case> cases = {
      {Synthetic("spirals", 10, 2, 2, 0.1, 1), "unknown kind \"spirals\""},
      {Synthetic("gaussian_blobs", 0, 2, 2, 0.1, 1),
       "num_samples must be >= 1, got 0"},
      {Synthetic("gaussian_blobs", 10, -1, 2, 0.1, 1),
       "num_features must be >= 1"},
      {Synthetic("teacher_regression", 10, 2, 0, 0.1, 1),
       "num_outputs must be >= 1"},
      {Synthetic("teacher_regression", 10, 2, 1, -0.5, 1),
       "noise must be finite and >= 0"},
      {Synthetic("teacher_regression", int64_t{1} << 40, 2, 1, 0, 1),
       "exceeds the limit"},
  };
  for (const Case& c : cases) {
    auto d = LoadDataSource(c.source, "", 1);
    ASSERT_FALSE(d.ok()) << c.expect;
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(d.status().message(), HasSubstr(c.expect));
  }
}

// --- SplitTail / Gather ---

Dataset Counting(int64_t n) {
  Dataset d;
  d.features = Tensor::Empty(DType::kFloat32, {n, 2});
  d.targets = Tensor::Empty(DType::kInt32, {n});
  for (int64_t i = 0; i < n; ++i) {
    d.features.data<float>()[2 * i] = static_cast<float>(i);
    d.features.data<float>()[2 * i + 1] = static_cast<float>(-i);
    d.targets.data<int32_t>()[i] = static_cast<int32_t>(100 + i);
  }
  return d;
}

TEST(SplitTailTest, EvalIsTheLastRows) {
  auto split = SplitTail(Counting(10), 0.3);  // floor(3.0) = 3
  ASSERT_TRUE(split.ok()) << split.status();
  const auto& [train, eval] = *split;
  EXPECT_EQ(train.num_rows(), 7);
  EXPECT_EQ(eval.num_rows(), 3);
  EXPECT_EQ(eval.features.data<float>()[0], 7.f);
  EXPECT_EQ(eval.targets.data<int32_t>()[2], 109);
  EXPECT_EQ(train.targets.data<int32_t>()[6], 106);
}

TEST(SplitTailTest, RejectsFractionsThatLeaveAnEmptySide) {
  EXPECT_THAT(SplitTail(Counting(10), 0).status().message(),
              HasSubstr("must be in (0, 1)"));
  EXPECT_THAT(SplitTail(Counting(10), 1).status().message(),
              HasSubstr("must be in (0, 1)"));
  EXPECT_THAT(SplitTail(Counting(10), 0.01).status().message(),
              HasSubstr("leaves 10 train and 0 eval rows"));
  EXPECT_THAT(SplitTail(Counting(3), 0.2).status().message(),
              HasSubstr("leaves 3 train and 0 eval rows"));  // floor(0.6)
  EXPECT_TRUE(SplitTail(Counting(2), 0.9).ok());  // floor(1.8) = 1 each
}

TEST(GatherTest, CopiesRowsOfFeaturesAndTargets) {
  Dataset d = Counting(5);
  Dataset b = *Gather(d, {4, 0, 4});
  EXPECT_EQ(b.features.shape(), (Shape{3, 2}));
  EXPECT_EQ(b.targets.shape(), (Shape{3}));
  EXPECT_EQ(b.features.data<float>()[0], 4.f);
  EXPECT_EQ(b.features.data<float>()[1], -4.f);
  EXPECT_EQ(b.features.data<float>()[2], 0.f);
  EXPECT_THAT(std::vector<int32_t>(b.targets.data<int32_t>(),
                                   b.targets.data<int32_t>() + 3),
              ElementsAre(104, 100, 104));
  // A copy: writing the batch leaves the dataset alone.
  b.features.data<float>()[0] = 99.f;
  EXPECT_EQ(d.features.data<float>()[8], 4.f);
}

TEST(GatherTest, RegressionTargets) {
  Dataset d;
  d.features = Tensor::FromVector({1, 2, 3}, {3, 1});
  d.targets = Tensor::FromVector({10, 11, 20, 21, 30, 31}, {3, 2});
  Dataset b = *Gather(d, {2, 1});
  EXPECT_EQ(b.targets.shape(), (Shape{2, 2}));
  EXPECT_THAT(
      std::vector<float>(b.targets.data<float>(), b.targets.data<float>() + 4),
      ElementsAre(30, 31, 20, 21));
}

// --- BatchSampler ---

TEST(BatchSamplerTest, UnshuffledWrapsInFileOrder) {
  BatchSampler s(5, 3, /*shuffle=*/false, 1);
  EXPECT_THAT(s.Next(), ElementsAre(0, 1, 2));
  EXPECT_THAT(s.Next(), ElementsAre(3, 4, 0));
  EXPECT_THAT(s.Next(), ElementsAre(1, 2, 3));
  EXPECT_EQ(s.position(), 9);
  EXPECT_EQ(s.epoch(), 1);
  BatchSampler big(2, 5, false, 1);  // batch larger than the data
  EXPECT_THAT(big.Next(), ElementsAre(0, 1, 0, 1, 0));
}

// Epochs 0 .. epochs-1 of n rows under `seed` as tools/shuffle_reference.py
// (the documented bijection in Python) computes them; empty when it cannot
// run.
std::vector<std::vector<int64_t>> PythonReference(int64_t n, uint64_t seed,
                                                  int epochs) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* ws = std::getenv("TEST_WORKSPACE");
  const std::string script =
      srcdir != nullptr && ws != nullptr
          ? std::string(srcdir) + "/" + ws + "/tools/shuffle_reference.py"
          : "tools/shuffle_reference.py";
  const std::string cmd =
      absl::StrCat("/usr/bin/python3 ", script, " ", n, " ", seed, " ", epochs);
  std::vector<std::vector<int64_t>> out;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return out;
  char line[1 << 16];
  while (fgets(line, sizeof(line), pipe) != nullptr) {
    std::vector<int64_t> rows;
    for (absl::string_view tok :
         absl::StrSplit(absl::StripAsciiWhitespace(line), ',')) {
      tok = absl::StripAsciiWhitespace(absl::StripPrefix(
          absl::StripSuffix(absl::StripAsciiWhitespace(tok), "]"), "["));
      int64_t v = 0;
      if (absl::SimpleAtoi(tok, &v)) rows.push_back(v);
    }
    out.push_back(rows);
  }
  pclose(pipe);
  return out;
}

TEST(BatchSamplerTest, ShuffledEpochsAreThePythonReference) {
  for (int64_t n : {1, 2, 7, 16, 17, 1000}) {
    const uint64_t seed = 42 + n;
    BatchSampler s(n, 3, /*shuffle=*/true, seed);
    std::vector<int64_t> stream;
    while (static_cast<int64_t>(stream.size()) < 3 * n) {  // batches span
      std::vector<int64_t> rows = s.Next();                // epochs
      stream.insert(stream.end(), rows.begin(), rows.end());
    }
    const std::vector<std::vector<int64_t>> want = PythonReference(n, seed, 3);
    ASSERT_EQ(want.size(), 3u) << "tools/shuffle_reference.py did not run";
    for (int e = 0; e < 3; ++e) {
      std::vector<int64_t> epoch(stream.begin() + e * n,
                                 stream.begin() + (e + 1) * n);
      EXPECT_EQ(epoch, want[e]) << "n " << n << " epoch " << e;
      EXPECT_EQ(std::set<int64_t>(epoch.begin(), epoch.end()).size(),
                static_cast<size_t>(n));  // every row once
    }
    if (n >= 7) {
      EXPECT_NE(want[0], want[1]) << n;
    }
  }
}

// No table: a row of an epoch of 10^12 rows is computed directly, and an
// epoch of a few thousand is a permutation.
TEST(BatchSamplerTest, ShuffleNeedsNoTable) {
  const int64_t huge = 1000000000000;
  std::set<int64_t> seen;
  for (int64_t i = 0; i < 1000; ++i) {
    const int64_t r = ShuffledRow(huge - 1 - i, huge, 9, 3);
    EXPECT_GE(r, 0);
    EXPECT_LT(r, huge);
    seen.insert(r);
  }
  EXPECT_EQ(seen.size(), 1000u);
  const int64_t n = 5000;
  std::vector<bool> hit(n, false);
  for (int64_t i = 0; i < n; ++i) hit[ShuffledRow(i, n, 1, 0)] = true;
  EXPECT_EQ(std::count(hit.begin(), hit.end(), true), n);
}

TEST(BatchSamplerTest, SameSeedSameBatchesOtherSeedOther) {
  BatchSampler a(100, 16, true, 5), b(100, 16, true, 5), c(100, 16, true, 6);
  bool any_diff = false;
  for (int i = 0; i < 20; ++i) {
    std::vector<int64_t> ra = a.Next();
    EXPECT_EQ(ra, b.Next());
    any_diff |= ra != c.Next();
  }
  EXPECT_TRUE(any_diff);
}

TEST(BatchSamplerTest, SeekResumesBitwise) {
  for (bool shuffle : {false, true}) {
    BatchSampler uninterrupted(13, 5, shuffle, 77);
    std::vector<std::vector<int64_t>> want;
    int64_t saved = 0;
    for (int i = 0; i < 12; ++i) {
      if (i == 4) saved = uninterrupted.position();
      want.push_back(uninterrupted.Next());
    }
    EXPECT_EQ(saved, 20);
    BatchSampler resumed(13, 5, shuffle, 77);
    resumed.Next();  // some unrelated state first
    resumed.Seek(saved);
    for (int i = 4; i < 12; ++i) {
      EXPECT_EQ(resumed.Next(), want[i])
          << "batch " << i << " shuffle " << shuffle;
    }
    // Seeking backwards works too.
    resumed.Seek(0);
    EXPECT_EQ(resumed.Next(), want[0]);
  }
}

}  // namespace
}  // namespace trainyard

namespace trainyard {
namespace {

TEST(SyntheticSplitTest, EvalSharesTheTaskButNotTheRows) {
  // gaussian_blobs with no noise: every row is exactly its class center, so
  // equal labels in train and eval must mean equal rows (same centers),
  // while the label sequences differ (different draws).
  trainyard::v1::DataSource src;
  auto* syn = src.mutable_synthetic();
  syn->set_kind("gaussian_blobs");
  syn->set_num_samples(64);
  syn->set_num_features(3);
  syn->set_num_outputs(4);
  syn->set_noise(0.0);
  auto train = LoadDataSource(src, "", 5, DataSplit::kTrain);
  auto eval = LoadDataSource(src, "", 5, DataSplit::kEval);
  ASSERT_TRUE(train.ok() && eval.ok());
  const int64_t* ty = train->targets.data<int64_t>();
  const int64_t* ey = eval->targets.data<int64_t>();
  EXPECT_NE(0, std::memcmp(ty, ey, train->targets.nbytes()));
  int matched = 0;
  for (int64_t i = 0; i < 64; ++i) {
    for (int64_t j = 0; j < 64; ++j) {
      if (ty[i] != ey[j]) continue;
      EXPECT_EQ(0, std::memcmp(train->features.data<float>() + 3 * i,
                               eval->features.data<float>() + 3 * j,
                               3 * sizeof(float)));
      ++matched;
    }
  }
  EXPECT_GT(matched, 0);
}

}  // namespace
}  // namespace trainyard
