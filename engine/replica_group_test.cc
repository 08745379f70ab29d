// Replicas as threads (and as processes) summing gradients over Gloo: the
// same bits as one replica summing every microbatch.
#include "engine/replica_group.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/file_util.h"
#include "engine/gradient_tree.h"
#include "engine/test_gradients.h"
#include "gtest/gtest.h"
#include "kernels/exec_context.h"

namespace trainyard {
namespace {

constexpr int64_t kN = 1031;

std::vector<Tensor> Gradients(int count, uint32_t seed) {
  return testing::RandomGradients(count, kN, seed);
}

const ExecContext* Host() {
  static const auto ctx = ExecContext::Create(Device::Cpu(), Precision::kFp32);
  return ctx->get();
}

// The tree sum of microbatches [first, first + count) of `g`.
Tensor TreeSum(const std::vector<Tensor>& g, int first, int count) {
  GradientTree tree(Host(), kN);
  for (int m = first; m < first + count; ++m) EXPECT_TRUE(tree.Add(g[m]).ok());
  Tensor out = Tensor::Empty(DType::kFloat32, {kN});
  EXPECT_TRUE(tree.Finish(&out).ok());
  return out;
}

using testing::Values;

TEST(ReplicaGroupTest, ReplicasAsThreadsGiveOneReplicasBits) {
  struct Case {
    int m, r;
  };
  for (Case c : {Case{8, 1}, Case{8, 2}, Case{8, 4}, Case{12, 3}}) {
    SCOPED_TRACE(absl::StrCat("M=", c.m, " R=", c.r));
    const std::vector<Tensor> g = Gradients(c.m, 7 + c.m * c.r);
    const std::vector<float> want = Values(TreeSum(g, 0, c.m));
    InProcessRendezvous rendezvous;
    std::vector<std::vector<float>> got(c.r);
    std::vector<absl::Status> status(c.r);
    std::vector<std::thread> threads;
    for (int r = 0; r < c.r; ++r) {
      threads.emplace_back([&, r] {
        ReplicaGroupOptions o;
        o.rank = r;
        o.size = c.r;
        o.key_prefix = absl::StrCat("job-1/stage-0/m", c.m, "r", c.r);
        o.timeout = absl::Seconds(20);
        auto group = ReplicaGroup::Join(&rendezvous, o);
        if (!group.ok()) {
          status[r] = group.status();
          return;
        }
        const int per = c.m / c.r;
        // Two steps through the same group: tags keep them apart.
        for (int step = 0; step < 2; ++step) {
          Tensor mine = TreeSum(g, r * per, per);
          status[r] = (*group)->SumInTreeOrder(&mine);
          if (!status[r].ok()) return;
          got[r] = Values(mine);
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < c.r; ++r) {
      ASSERT_TRUE(status[r].ok()) << "replica " << r << ": " << status[r];
      EXPECT_EQ(got[r], want) << "replica " << r;
    }
  }
}

// Fewer elements than replicas: some replicas' slices are empty.
TEST(ReplicaGroupTest, GradientsShorterThanTheGroupStillSum) {
  const int kR = 4;
  for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{5}}) {
    SCOPED_TRACE(absl::StrCat("n=", n));
    InProcessRendezvous rendezvous;
    std::vector<std::vector<float>> got(kR);
    std::vector<absl::Status> status(kR);
    std::vector<std::thread> threads;
    for (int r = 0; r < kR; ++r) {
      threads.emplace_back([&, r] {
        ReplicaGroupOptions o;
        o.rank = r;
        o.size = kR;
        o.key_prefix = absl::StrCat("job-s/n", n);
        o.timeout = absl::Seconds(20);
        auto group = ReplicaGroup::Join(&rendezvous, o);
        if (!group.ok()) {
          status[r] = group.status();
          return;
        }
        Tensor mine = Tensor::Empty(DType::kFloat32, {n});
        for (int64_t i = 0; i < n; ++i) {
          mine.data<float>()[i] = static_cast<float>((r + 1) * (i + 1));
        }
        status[r] = (*group)->SumInTreeOrder(&mine);
        got[r] = Values(mine);
      });
    }
    for (auto& t : threads) t.join();
    std::vector<float> want;
    for (int64_t i = 0; i < n; ++i) want.push_back(10.0f * (i + 1));
    for (int r = 0; r < kR; ++r) {
      ASSERT_TRUE(status[r].ok()) << "replica " << r << ": " << status[r];
      EXPECT_EQ(got[r], want) << "replica " << r;
    }
  }
}

TEST(ReplicaGroupTest, AMissingReplicaIsADeadlineNamingTheGroup) {
  InProcessRendezvous rendezvous;
  ReplicaGroupOptions o;
  o.rank = 0;
  o.size = 2;  // replica 1 never comes
  o.key_prefix = "job-2/stage-1";
  o.timeout = absl::Seconds(1);
  const absl::Time start = absl::Now();
  auto group = ReplicaGroup::Join(&rendezvous, o);
  ASSERT_FALSE(group.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(group.status()) ||
              absl::IsUnavailable(group.status()))
      << group.status();
  EXPECT_TRUE(absl::StrContains(group.status().message(),
                                "replica group job-2/stage-1 (replica 0 of 2)"))
      << group.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
  EXPECT_EQ(ReplicaGroup::Join(&rendezvous, ReplicaGroupOptions{2, 2})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// A write-once store in a folder, for replicas as processes: Put writes
// a file atomically (an existing one with other bytes is AlreadyExists),
// Get polls for it.
class FolderRendezvous final : public Rendezvous {
 public:
  explicit FolderRendezvous(std::string dir) : dir_(std::move(dir)) {}
  absl::Status Put(const std::string& key, std::string value) override {
    const std::string path = Path(key);
    absl::StatusOr<std::string> old = ReadFileToString(path);
    if (old.ok()) {
      return *old == value ? absl::OkStatus() : absl::AlreadyExistsError(key);
    }
    return WriteFileAtomically(path, value);
  }
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      absl::StatusOr<std::string> v = ReadFileToString(Path(key));
      if (v.ok()) return v;
      if (absl::Now() > deadline) return absl::DeadlineExceededError(key);
      absl::SleepFor(absl::Milliseconds(5));
    }
  }

 private:
  std::string Path(std::string key) const {
    for (char& c : key) {
      if (c == '/') c = '_';
    }
    return JoinPath(dir_, key);
  }
  const std::string dir_;
};

TEST(ReplicaGroupTest, ReplicasAsProcessesGiveOneReplicasBits) {
  const int kM = 8, kR = 4, kPer = kM / kR;
  const std::vector<Tensor> g = Gradients(kM, 99);
  const std::vector<float> want = Values(TreeSum(g, 0, kM));
  const std::string dir =
      JoinPath(::testing::TempDir(), absl::StrCat("replicas-", getpid()));
  ASSERT_TRUE(CreateDirectories(dir).ok());
  std::vector<pid_t> children;
  for (int r = 0; r < kR; ++r) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // The child: join, sum, write the result, exit 0 only on success.
      FolderRendezvous rendezvous(dir);
      ReplicaGroupOptions o;
      o.rank = r;
      o.size = kR;
      o.key_prefix = "job-3/stage-0";
      o.timeout = absl::Seconds(20);
      auto group = ReplicaGroup::Join(&rendezvous, o);
      if (!group.ok()) _exit(2);
      Tensor mine = TreeSum(g, r * kPer, kPer);
      if (!(*group)->SumInTreeOrder(&mine).ok()) _exit(3);
      const std::string bytes(static_cast<const char*>(mine.ptr()),
                              mine.nbytes());
      if (!WriteFileAtomically(JoinPath(dir, absl::StrCat("out", r)), bytes)
               .ok()) {
        _exit(4);
      }
      _exit(0);
    }
    children.push_back(pid);
  }
  for (int r = 0; r < kR; ++r) {
    int wstatus = 0;
    ASSERT_EQ(waitpid(children[r], &wstatus, 0), children[r]);
    ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0)
        << "replica " << r << " status " << wstatus;
    absl::StatusOr<std::string> bytes =
        ReadFileToString(JoinPath(dir, absl::StrCat("out", r)));
    ASSERT_TRUE(bytes.ok());
    ASSERT_EQ(bytes->size(), want.size() * sizeof(float));
    std::vector<float> got(want.size());
    std::memcpy(got.data(), bytes->data(), bytes->size());
    EXPECT_EQ(got, want) << "replica " << r;
  }
}

}  // namespace
}  // namespace trainyard
