#include "core/tensor.h"

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
  for (DType d : {DType::kFloat32, DType::kBFloat16, DType::kInt32,
                  DType::kInt64, DType::kUInt8}) {
    auto parsed = DTypeFromName(DTypeName(d));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_FALSE(DTypeFromName("float16").ok());
}

}  // namespace
}  // namespace trainyard
