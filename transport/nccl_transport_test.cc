// Header codec and option checks run everywhere. The communicator tests
// need CUDA devices: without one they are skipped with the reason, unless
// TRAINYARD_REQUIRE_GPU=1 (set by the gpu-tagged target that
// tools/gpu_check.sh runs), where a missing device is a failure.
#include "transport/nccl_transport.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/frame.h"
#include "transport/nccl_header.h"
#include "transport/rendezvous.h"

#ifdef TRAINYARD_HAVE_NCCL
#include <cuda_runtime.h>
#endif

namespace trainyard {
namespace {

using ::testing::HasSubstr;

Message SampleMessage() {
  Message m;
  m.kind = MessageKind::kGradient;
  m.step = 7;
  m.microbatch = 3;
  m.chunk = 2;
  m.tensors.emplace_back("x", Tensor::FromVector({1, 2, 3, 4, 5, 6}, {2, 3}));
  Tensor labels = Tensor::Empty(DType::kInt64, {2});
  labels.data<int64_t>()[0] = 4;
  labels.data<int64_t>()[1] = -1;
  m.tensors.emplace_back("labels", labels);
  m.tensors.emplace_back("empty", Tensor::Empty(DType::kBFloat16, {0, 5}));
  return m;
}

TEST(NcclHeaderTest, RoundTripsKindStepChunkAndTensorDescriptors) {
  absl::StatusOr<std::string> bytes = EncodeNcclHeader(SampleMessage());
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(bytes->size(), kNcclHeaderBytes);
  absl::StatusOr<NcclHeader> h = DecodeNcclHeader(*bytes);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->kind, MessageKind::kGradient);
  EXPECT_EQ(h->step, 7);
  EXPECT_EQ(h->microbatch, 3);
  EXPECT_EQ(h->chunk, 2);
  EXPECT_EQ(h->payload_bytes, 6 * 4 + 2 * 8);
  ASSERT_EQ(h->tensors.size(), 3u);
  EXPECT_EQ(h->tensors[0].name, "x");
  EXPECT_EQ(h->tensors[0].dtype, DType::kFloat32);
  EXPECT_EQ(h->tensors[0].shape, (Shape{2, 3}));
  EXPECT_EQ(h->tensors[1].name, "labels");
  EXPECT_EQ(h->tensors[1].dtype, DType::kInt64);
  EXPECT_EQ(h->tensors[2].dtype, DType::kBFloat16);
  EXPECT_EQ(h->tensors[2].shape, (Shape{0, 5}));
}

TEST(NcclHeaderTest, ChunkSitsAtOffset22UpTo65535) {
  for (int32_t chunk : {0, 7, kMaxFrameChunk}) {
    Message m = SampleMessage();
    m.chunk = chunk;
    absl::StatusOr<std::string> bytes = EncodeNcclHeader(m);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    uint16_t on_wire;  // u16 after the tensor count
    std::memcpy(&on_wire, bytes->data() + 22, 2);
    EXPECT_EQ(on_wire, chunk);
    absl::StatusOr<NcclHeader> h = DecodeNcclHeader(*bytes);
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(h->chunk, chunk);
    EXPECT_EQ(h->tensors.size(), 3u);  // the count beside it is untouched
  }
}

TEST(NcclHeaderTest, RejectsChunkOutsideU16) {
  for (int32_t chunk : {-1, kMaxFrameChunk + 1}) {
    Message m = SampleMessage();
    m.chunk = chunk;
    const absl::Status s = EncodeNcclHeader(m).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(
        s.message(),
        HasSubstr(absl::StrCat(
            "nccl message header: chunk must be in [0, 65535], got ", chunk)));
  }
}

// One descriptor codec for both transports: after its 32-byte prefix the
// header holds exactly what transport/frame.h writes for a TCP frame.
TEST(NcclHeaderTest, DescriptorsAreTheFrameCodecs) {
  const Message m = SampleMessage();
  std::string descs;
  absl::StatusOr<uint64_t> payload =
      AppendTensorDescs("test", m.tensors, TensorDescLimits(), &descs);
  ASSERT_TRUE(payload.ok()) << payload.status();
  const std::string header = *EncodeNcclHeader(m);
  EXPECT_EQ(header.substr(32, descs.size()), descs);
  EXPECT_EQ(header.find_first_not_of('\0', 32 + descs.size()),
            std::string::npos);  // zero padding
  absl::StatusOr<std::string> frame =
      EncodeFrameHeader(FrameKind::kGradient, "job", 7, 3, 2, m.tensors);
  ASSERT_TRUE(frame.ok()) << frame.status();
  EXPECT_EQ(frame->substr(frame->size() - descs.size()), descs);
}

TEST(NcclHeaderTest, RejectsMessagesBeyondTheLimits) {
  Message many;
  for (int i = 0; i <= kNcclMaxTensors; ++i) {
    many.tensors.emplace_back("t", Tensor::Empty(DType::kUInt8, {1}));
  }
  EXPECT_THAT(EncodeNcclHeader(many).status().message(),
              HasSubstr("33 tensors, limit 32"));
  Message long_name;
  long_name.tensors.emplace_back(std::string(kNcclMaxNameLength + 1, 'n'),
                                 Tensor::Empty(DType::kUInt8, {1}));
  EXPECT_EQ(EncodeNcclHeader(long_name).status().code(),
            absl::StatusCode::kInvalidArgument);
  Message deep;
  deep.tensors.emplace_back("deep", Tensor::Empty(DType::kUInt8, Shape(9, 1)));
  EXPECT_THAT(EncodeNcclHeader(deep).status().message(),
              HasSubstr("tensor \"deep\" has 9 dims, limit 8"));
}

TEST(NcclHeaderTest, RejectsCorruptHeaders) {
  const std::string good = *EncodeNcclHeader(SampleMessage());
  EXPECT_THAT(DecodeNcclHeader(good.substr(1)).status().message(),
              HasSubstr("expected 8192"));
  std::string bad_magic = good;
  bad_magic[0] ^= 1;
  EXPECT_EQ(DecodeNcclHeader(bad_magic).status().code(),
            absl::StatusCode::kDataLoss);
  std::string old_version = good;
  old_version[4] = 2;  // u16 version at offset 4; 2 had no chunk
  EXPECT_THAT(DecodeNcclHeader(old_version).status().message(),
              HasSubstr("unsupported version 2 (expected 3)"));
  std::string bad_kind = good;
  bad_kind[6] = 9;  // u16 kind at offset 6
  EXPECT_THAT(DecodeNcclHeader(bad_kind).status().message(),
              HasSubstr("unknown message kind 9"));
  std::string bad_payload = good;
  bad_payload[24] ^= 1;  // u64 payload bytes at offset 24
  EXPECT_THAT(DecodeNcclHeader(bad_payload).status().message(),
              HasSubstr("tensors hold 40 bytes, payload size says 41"));
  std::string bad_dim = good;
  // x's first dim: after the prefix, u16 name length, u8 dtype, u8 ndim;
  // its top byte set makes it negative.
  bad_dim[32 + 4 + 7] = static_cast<char>(0x80);
  EXPECT_THAT(DecodeNcclHeader(bad_dim).status().message(),
              HasSubstr("nccl message header: tensor 0 has dimension 0 = -"));
  std::string bad_dtype = good;
  bad_dtype[32 + 2] = 99;  // x's dtype
  EXPECT_THAT(DecodeNcclHeader(bad_dtype).status().message(),
              HasSubstr("tensor 0 has unknown dtype 99"));
  std::string many = good;
  many[20] = 33;  // u16 tensor count at offset 20
  EXPECT_THAT(DecodeNcclHeader(many).status().message(),
              HasSubstr("33 tensors, limit 32"));
}

TEST(NcclTransportOptionsTest, NamesTheBadField) {
  InProcessRendezvous rdv;
  NcclTransportOptions o;
  o.job_id = "job";
  o.rendezvous = &rdv;
  o.world_size = 2;
  o.rank = 1;
  EXPECT_TRUE(ValidateNcclTransportOptions(o).ok());
  auto message_with = [&](auto mutate) {
    NcclTransportOptions copy = o;
    mutate(copy);
    absl::Status st = ValidateNcclTransportOptions(copy);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    return std::string(st.message());
  };
  EXPECT_THAT(message_with([](auto& c) { c.job_id = ""; }),
              HasSubstr("job_id"));
  EXPECT_THAT(message_with([](auto& c) { c.rendezvous = nullptr; }),
              HasSubstr("rendezvous: must not be null"));
  EXPECT_THAT(message_with([](auto& c) { c.world_size = 0; }),
              HasSubstr("world_size: must be >= 1, got 0"));
  EXPECT_THAT(message_with([](auto& c) { c.rank = 2; }),
              HasSubstr("rank: must be in [0, 2), got 2"));
  EXPECT_THAT(message_with([](auto& c) { c.device = -1; }),
              HasSubstr("device: must be >= 0"));
  EXPECT_EQ(CreateNcclTransport([&] {
              NcclTransportOptions c = o;
              c.rank = 5;
              return c;
            }())
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// The number of CUDA devices, or 0 with the reason in *why.
int CudaDevices(std::string* why) {
#ifdef TRAINYARD_HAVE_NCCL
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
    return 0;
  }
  if (count == 0) *why = "cudaGetDeviceCount: 0 devices";
  return count;
#else
  *why = "built without CUDA/NCCL";
  return 0;
#endif
}

bool GpuRequired() {
  const char* v = std::getenv("TRAINYARD_REQUIRE_GPU");
  return v != nullptr && std::string(v) == "1";
}

// Skips (or, under TRAINYARD_REQUIRE_GPU=1, fails) unless `n` devices exist.
#define REQUIRE_DEVICES(n)                                                  \
  do {                                                                      \
    std::string why;                                                        \
    const int have = CudaDevices(&why);                                     \
    if (have == 0) {                                                        \
      if (GpuRequired()) FAIL() << "no CUDA device: " << why;               \
      GTEST_SKIP() << "no CUDA device: " << why;                            \
    }                                                                       \
    if (have < (n)) {                                                       \
      GTEST_SKIP() << "needs " << (n) << " CUDA devices, this machine has " \
                   << have;                                                 \
    }                                                                       \
  } while (0)

// Runs on every machine: creating a transport where it cannot exist is a
// Status naming the reason, never a crash.
TEST(NcclTransportTest, CreateWithoutUsableDeviceIsACleanError) {
  InProcessRendezvous rdv;
  NcclTransportOptions o;
  o.job_id = "job";
  o.rendezvous = &rdv;
  std::string why;
  const int have = CudaDevices(&why);
  o.device = have;  // one past the last device (0 where there is none)
  absl::StatusOr<std::unique_ptr<NcclTransport>> t = CreateNcclTransport(o);
  ASSERT_FALSE(t.ok());
  if (!NcclTransportBuilt()) {
    EXPECT_EQ(t.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(t.status().message(), HasSubstr("built without CUDA/NCCL"));
  } else if (have == 0) {
    EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(t.status().message(), HasSubstr("no CUDA device"));
  } else {
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(t.status().message(), HasSubstr("does not exist"));
  }
  EXPECT_THAT(t.status().message(), HasSubstr("job \"job\""));
}

TEST(NcclTransportTest, BuildFlagMatchesTheLibrary) {
#ifdef TRAINYARD_HAVE_NCCL
  EXPECT_TRUE(NcclTransportBuilt());
#else
  EXPECT_FALSE(NcclTransportBuilt());
#endif
}

NcclTransportOptions RankOptions(Rendezvous* rdv, int rank, int world,
                                 int device) {
  NcclTransportOptions o;
  o.job_id = "nccl-test";
  o.rendezvous = rdv;
  o.rank = rank;
  o.world_size = world;
  o.device = device;
  o.init_timeout = absl::Seconds(60);
  return o;
}

TEST(NcclTransportGpuTest, SingleRankAllReduceAndSelfSendIsRefused) {
  REQUIRE_DEVICES(1);
  InProcessRendezvous rdv;
  absl::StatusOr<std::unique_ptr<NcclTransport>> t =
      CreateNcclTransport(RankOptions(&rdv, 0, 1, 0));
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<double> v = {1.5, -2.0, 0.0, 1e-300};
  ASSERT_TRUE((*t)->AllReduceSum(&v, absl::Seconds(30)).ok());
  EXPECT_EQ(v, (std::vector<double>{1.5, -2.0, 0.0, 1e-300}));
  EXPECT_EQ((*t)->Send(0, SampleMessage()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*t)->Recv(0, absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  (*t)->Abort(absl::CancelledError("stage 0 failed: test"));
  absl::Status after = (*t)->AllReduceSum(&v, absl::Seconds(1));
  EXPECT_EQ(after.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(after.message(), HasSubstr("stage 0 failed: test"));
}

TEST(NcclTransportGpuTest, MissingRankZeroTimesOutNamingTheKey) {
  REQUIRE_DEVICES(1);
  InProcessRendezvous rdv;
  NcclTransportOptions o = RankOptions(&rdv, 1, 2, 0);
  o.init_timeout = absl::Milliseconds(200);
  absl::StatusOr<std::unique_ptr<NcclTransport>> t = CreateNcclTransport(o);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(t.status().message(), HasSubstr("\"nccl-test/nccl_id\""));
}

// Creates ranks 0 and 1 on devices 0 and 1 in parallel (creation blocks
// until both joined).
std::vector<std::unique_ptr<NcclTransport>> TwoRanks(Rendezvous* rdv) {
  std::vector<absl::StatusOr<std::unique_ptr<NcclTransport>>> made(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back(
        [&, r] { made[r] = CreateNcclTransport(RankOptions(rdv, r, 2, r)); });
  }
  for (auto& t : threads) t.join();
  std::vector<std::unique_ptr<NcclTransport>> out;
  for (auto& m : made) {
    EXPECT_TRUE(m.ok()) << m.status();
    if (m.ok()) out.push_back(std::move(*m));
  }
  return out;
}

TEST(NcclTransportGpuTest, TwoRanksSendRecvBothWaysAndAllReduce) {
  REQUIRE_DEVICES(2);
  InProcessRendezvous rdv;
  auto ranks = TwoRanks(&rdv);
  ASSERT_EQ(ranks.size(), 2u);
  std::thread peer([&] {
    // Rank 1: receive an activation, answer with a gradient, all-reduce.
    absl::StatusOr<Message> m = ranks[1]->Recv(0, absl::Seconds(30));
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->kind, MessageKind::kGradient);
    EXPECT_EQ(m->step, 7);
    EXPECT_EQ(m->chunk, 2);
    ASSERT_EQ(m->tensors.size(), 3u);
    EXPECT_EQ(m->tensors[0].first, "x");
    EXPECT_EQ(m->tensors[0].second.shape(), (Shape{2, 3}));
    EXPECT_EQ(m->tensors[0].second.data<float>()[5], 6.0f);
    EXPECT_EQ(m->tensors[1].second.data<int64_t>()[1], -1);
    EXPECT_EQ(m->tensors[2].second.shape(), (Shape{0, 5}));
    Message back;
    back.kind = MessageKind::kActivation;
    back.step = 8;
    back.tensors.emplace_back("g", Tensor::FromVector({0.25f, -8.0f}, {2}));
    ASSERT_TRUE(ranks[1]->Send(0, std::move(back)).ok());
    std::vector<double> v = {0.0, 3.25, 1.0};
    ASSERT_TRUE(ranks[1]->AllReduceSum(&v, absl::Seconds(30)).ok());
    EXPECT_EQ(v, (std::vector<double>{0.1, 3.25, 2.0}));
  });
  ASSERT_TRUE(ranks[0]->Send(1, SampleMessage()).ok());
  absl::StatusOr<Message> back = ranks[0]->Recv(1, absl::Seconds(30));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->step, 8);
  EXPECT_EQ(back->tensors[0].second.data<float>()[1], -8.0f);
  // One non-zero contributor per slot (plus a small-integer slot): exact.
  std::vector<double> v = {0.1, 0.0, 1.0};
  ASSERT_TRUE(ranks[0]->AllReduceSum(&v, absl::Seconds(30)).ok());
  EXPECT_EQ(v, (std::vector<double>{0.1, 3.25, 2.0}));
  peer.join();
}

TEST(NcclTransportGpuTest, RecvTimeoutIsAnErrorAndAbortsTheTransport) {
  REQUIRE_DEVICES(2);
  InProcessRendezvous rdv;
  auto ranks = TwoRanks(&rdv);
  ASSERT_EQ(ranks.size(), 2u);
  const absl::Time start = absl::Now();
  absl::StatusOr<Message> m = ranks[1]->Recv(0, absl::Milliseconds(300));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(m.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(m.status().message(), HasSubstr("no message from rank 0"));
  EXPECT_EQ(ranks[1]->Send(0, SampleMessage()).code(),
            absl::StatusCode::kAborted);
  ranks[0]->Abort(absl::CancelledError("test over"));
}

}  // namespace
}  // namespace trainyard
