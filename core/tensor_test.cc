#include "core/tensor.h"

#include <cstdlib>
#include <limits>

#include "gtest/gtest.h"

namespace trainyard {
namespace {

TEST(TensorTest, RowsShareStorage) {
  Tensor t = Tensor::FromVector({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor mid = t.Rows(1, 2);
  EXPECT_EQ(mid.shape(), (Shape{1, 2}));
  EXPECT_EQ(mid.data<float>()[0], 3.0f);
  mid.data<float>()[1] = 40.0f;
  EXPECT_EQ(t.data<float>()[3], 40.0f);
}

TEST(TensorTest, CloneDoesNotShare) {
  Tensor t = Tensor::FromVector({1, 2}, {2});
  Tensor c = t.Clone();
  c.data<float>()[0] = 9;
  EXPECT_EQ(t.data<float>()[0], 1.0f);
}

TEST(TensorTest, StorageIsAligned) {
  Tensor t = Tensor::Empty(DType::kFloat32, {17, 3});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % 64, 0u);
}

TEST(TensorTest, DTypeNamesRoundTrip) {
  for (DType d : kAllDTypes) {
    auto parsed = DTypeFromName(DTypeName(d));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_FALSE(DTypeFromName("float8").ok());
}

TEST(TensorTest, Float64Exists) {
  Tensor t = Tensor::Zeros(DType::kFloat64, {3});
  EXPECT_EQ(t.nbytes(), 24u);
  t.data<double>()[2] = 0.1;
  EXPECT_EQ(t.data<double>()[2], 0.1);
  EXPECT_EQ(DTypeName(DType::kFloat64), "float64");
}

TEST(TensorTest, CreateRefusesBadShapesWithAStatus) {
  auto neg = Tensor::Create(DType::kFloat32, {2, -1});
  ASSERT_FALSE(neg.ok());
  EXPECT_EQ(neg.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(neg.status().message().find("[2, -1]"), std::string::npos);
  auto huge = Tensor::Create(DType::kFloat32, {1 << 30, 1 << 30, 1 << 30});
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("too large"), std::string::npos);
}

// Hands out host memory but says it is a GPU's, so host access can be
// checked without one.
class FakeDeviceAllocator final : public Allocator {
 public:
  Device device() const override { return Device::Cuda(0); }
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    if (bytes > (size_t{1} << 20)) {
      return absl::ResourceExhaustedError("fake device is full");
    }
    ++live;
    return std::malloc(bytes == 0 ? 1 : bytes);
  }
  void Deallocate(void* p) override {
    if (p != nullptr) --live;
    std::free(p);
  }
  int live = 0;
};

TEST(TensorTest, StorageComesFromTheAllocatorAndReturnsToIt) {
  FakeDeviceAllocator alloc;
  {
    auto t = Tensor::Create(DType::kFloat32, {4, 4}, &alloc);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->device(), Device::Cuda(0));
    EXPECT_NE(t->ptr(), nullptr);
    Tensor view = t->Rows(1, 3);
    EXPECT_EQ(alloc.live, 1);
  }
  EXPECT_EQ(alloc.live, 0);
}

TEST(TensorTest, AllocationFailureIsAStatusNamingTheTensor) {
  FakeDeviceAllocator alloc;
  auto t = Tensor::Create(DType::kFloat32, {1 << 20}, &alloc);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(t.status().message().find("float32[1048576] on cuda:0"),
            std::string::npos)
      << t.status();
}

TEST(TensorTest, HostAllocatorReusesFreedBlocksOfTheSameSize) {
  void* first;
  {
    Tensor t = Tensor::Empty(DType::kFloat32, {256, 1024});  // 1 MiB
    first = t.raw_data();
  }
  Tensor again = Tensor::Empty(DType::kFloat32, {1024, 256});
  EXPECT_EQ(again.raw_data(), first);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(again.raw_data()) % 64, 0u);
  // A different size gets other memory while `again` is alive.
  Tensor other = Tensor::Empty(DType::kFloat32, {512, 1024});
  EXPECT_NE(other.raw_data(), first);
}

TEST(TensorDeathTest, HostAccessToADeviceTensorIsABug) {
  FakeDeviceAllocator alloc;
  Tensor t = *Tensor::Create(DType::kFloat32, {2}, &alloc);
  EXPECT_DEATH(t.data<float>(), "host access to a tensor on cuda:0");
  EXPECT_DEATH(t.Clone(), "host access to a tensor on cuda:0");
}

}  // namespace
}  // namespace trainyard
