#include "common/tensor.h"

#include "common/cpu_device.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

TEST(TensorTest, ZerosFromHostAndViewsShareStorage) {
  CpuDevice device(0, 1);
  auto t = Tensor::Zeros(&device, {2, 3});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->num_elements(), 6);
  EXPECT_EQ(t->num_bytes(), 24);
  EXPECT_EQ(t->dim(-1), 3);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(t->data<float>()[i], 0.f);

  auto row = t->View(3, {3});
  ASSERT_TRUE(row.ok());
  ASSERT_TRUE(row->CopyFromHost({1.f, 2.f, 3.f}).ok());
  EXPECT_EQ(t->data<float>()[4], 2.f);  // written through the view
  EXPECT_EQ(t->View(4, {3}).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(TensorTest, ShapeMismatchesAreErrors) {
  CpuDevice device(0, 1);
  auto t = *Tensor::Zeros(&device, {4});
  EXPECT_EQ(t.CopyFromHost({1.f}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.Reshape({3}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(t.Reshape({2, 2}).ok());
  EXPECT_EQ(Tensor::Empty(&device, {-1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShapeToString({2, 1, 28, 28}), "[2, 1, 28, 28]");
}

}  // namespace
}  // namespace ps
