#include "common/tensor_view.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace muonps {
namespace {

// Create's result must be INVALID_ARGUMENT with `field` in the message.
void ExpectInvalidNaming(const absl::StatusOr<TensorView>& view,
                         absl::string_view field) {
  ASSERT_FALSE(view.ok()) << "accepted: " << view->DebugString();
  EXPECT_EQ(view.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(view.status().message().find(field), absl::string_view::npos)
      << "message does not name \"" << field << "\": " << view.status();
}

TEST(TensorViewCreateTest, NegativeDimIsRejectedNamingItsIndex) {
  float data[6];
  ExpectInvalidNaming(TensorView::Create(data, DType::kFloat32, {2, -3}),
                      "shape[1]");
  ExpectInvalidNaming(TensorView::Create(data, DType::kFloat32, {-1}),
                      "shape[0]");
}

TEST(TensorViewCreateTest, RankAboveEightIsRejectedAndEightIsAccepted) {
  float data[1];
  const std::vector<int64_t> nine_ones(TensorView::kMaxRank + 1, 1);
  ExpectInvalidNaming(TensorView::Create(data, DType::kFloat32, nine_ones),
                      "shape");
  const std::vector<int64_t> eight_ones(TensorView::kMaxRank, 1);
  const absl::StatusOr<TensorView> view =
      TensorView::Create(data, DType::kFloat32, eight_ones);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->rank(), 8);
  EXPECT_EQ(view->num_elements(), 1);
}

TEST(TensorViewCreateTest, StridesOfWrongLengthAreRejected) {
  float data[6];
  ExpectInvalidNaming(TensorView::Create(data, DType::kFloat32, {2, 3}, {1}),
                      "strides");
  ExpectInvalidNaming(
      TensorView::Create(data, DType::kFloat32, {2, 3}, {3, 1, 1}), "strides");
}

TEST(TensorViewCreateTest, NegativeStrideIsRejectedNamingItsIndex) {
  float data[6];
  ExpectInvalidNaming(
      TensorView::Create(data, DType::kFloat32, {2, 3}, {3, -1}), "strides[1]");
}

TEST(TensorViewCreateTest, NullDataIsRejectedOnlyWhenThereAreElements) {
  ExpectInvalidNaming(TensorView::Create(nullptr, DType::kFloat32, {2, 3}),
                      "data");
  // A scalar (rank 0) has one element.
  ExpectInvalidNaming(TensorView::Create(nullptr, DType::kFloat32, {}), "data");
  const absl::StatusOr<TensorView> empty =
      TensorView::Create(nullptr, DType::kBFloat16, {0, 5});
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->num_elements(), 0);
  EXPECT_EQ(empty->size_bytes(), 0u);
  EXPECT_EQ(empty->data(), nullptr);
}

TEST(TensorViewCreateTest, ElementCountOverflowingInt64IsRejected) {
  float data[1];
  const int64_t two_pow_32 = int64_t{1} << 32;
  ExpectInvalidNaming(
      TensorView::Create(data, DType::kFloat32, {two_pow_32, two_pow_32}),
      "overflows");
  const int64_t max = std::numeric_limits<int64_t>::max();
  ExpectInvalidNaming(
      TensorView::Create(data, DType::kFloat32, {max / 2 + 1, 2}), "overflows");
  // Counts are capped at INT64_MAX / 8 so size_bytes() cannot overflow.
  ExpectInvalidNaming(TensorView::Create(data, DType::kFloat32, {max, 1}),
                      "overflows");
  const absl::StatusOr<TensorView> largest =
      TensorView::Create(data, DType::kFloat32, {max / 8, 1});
  ASSERT_TRUE(largest.ok()) << largest.status();
  EXPECT_EQ(largest->num_elements(), max / 8);
  EXPECT_EQ(largest->size_bytes(), static_cast<size_t>(max / 8) * 4);
}

// With a zero dim the element count is 0, but row-major strides still
// multiply the other dims (2^40 * 2^40 overflows int64, undefined behaviour
// fatal under --config=sanitize): Create must reject such a shape.
TEST(TensorViewCreateTest,
     ZeroSizedShapeWithHugeOtherDimsDoesNotOverflowStrides) {
  const int64_t big = int64_t{1} << 40;
  ExpectInvalidNaming(
      TensorView::Create(nullptr, DType::kFloat32, {0, big, big}), "overflows");
  const absl::StatusOr<TensorView> view =
      TensorView::Create(nullptr, DType::kFloat32, {0, 1 << 20, 1 << 20});
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->num_elements(), 0);
  EXPECT_TRUE(view->is_contiguous());
}

TEST(TensorViewTest, StridesDefaultToRowMajorContiguous) {
  float data[24];
  const absl::StatusOr<TensorView> view =
      TensorView::Create(data, DType::kFloat32, {2, 3, 4});
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->strides(), (std::vector<int64_t>{12, 4, 1}));
  EXPECT_EQ(view->shape(), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(view->dim(1), 3);
  EXPECT_EQ(view->stride(0), 12);
  EXPECT_EQ(view->data(), data);
  EXPECT_EQ(view->float_data(), data);
  EXPECT_EQ(view->dtype(), DType::kFloat32);
  EXPECT_TRUE(view->is_contiguous());
  EXPECT_EQ(ContiguousStrides({5, 7}), (std::vector<int64_t>{7, 1}));
  EXPECT_TRUE(ContiguousStrides({}).empty());
}

TEST(TensorViewTest, ExplicitRowMajorStridesAreContiguous) {
  float data[6];
  const absl::StatusOr<TensorView> view =
      TensorView::Create(data, DType::kFloat32, {2, 3}, {3, 1});
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_TRUE(view->is_contiguous());
}

TEST(TensorViewTest, TransposedAndPaddedStridesAreNotContiguous) {
  float data[8];
  const absl::StatusOr<TensorView> transposed =
      TensorView::Create(data, DType::kFloat32, {3, 2}, {1, 3});
  ASSERT_TRUE(transposed.ok()) << transposed.status();
  EXPECT_FALSE(transposed->is_contiguous());
  EXPECT_EQ(transposed->strides(), (std::vector<int64_t>{1, 3}));
  const absl::StatusOr<TensorView> padded_rows =
      TensorView::Create(data, DType::kFloat32, {2, 3}, {4, 1});
  ASSERT_TRUE(padded_rows.ok()) << padded_rows.status();
  EXPECT_FALSE(padded_rows->is_contiguous());
  const absl::StatusOr<TensorView> every_other =
      TensorView::Create(data, DType::kFloat32, {4}, {2});
  ASSERT_TRUE(every_other.ok()) << every_other.status();
  EXPECT_FALSE(every_other->is_contiguous());
}

TEST(TensorViewTest, SizeOneDimsWithAnyStrideStayContiguous) {
  float data[12];
  const absl::StatusOr<TensorView> outer_and_inner =
      TensorView::Create(data, DType::kFloat32, {1, 4, 1}, {99, 1, 7});
  ASSERT_TRUE(outer_and_inner.ok()) << outer_and_inner.status();
  EXPECT_TRUE(outer_and_inner->is_contiguous());
  const absl::StatusOr<TensorView> middle =
      TensorView::Create(data, DType::kFloat32, {4, 1, 3}, {3, 1000, 1});
  ASSERT_TRUE(middle.ok()) << middle.status();
  EXPECT_TRUE(middle->is_contiguous());
  // A size-1 dim does not excuse a wrong stride elsewhere.
  const absl::StatusOr<TensorView> wrong_outer =
      TensorView::Create(data, DType::kFloat32, {4, 1, 3}, {4, 1000, 1});
  ASSERT_TRUE(wrong_outer.ok()) << wrong_outer.status();
  EXPECT_FALSE(wrong_outer->is_contiguous());
}

TEST(TensorViewTest, DebugStringShowsDtypeAndShape) {
  std::vector<float> data(64 * 32);
  const absl::StatusOr<TensorView> matrix =
      TensorView::Create(data.data(), DType::kFloat32, {64, 32});
  ASSERT_TRUE(matrix.ok()) << matrix.status();
  EXPECT_EQ(matrix->DebugString(), "fp32[64, 32]");
  const absl::StatusOr<TensorView> vector =
      TensorView::Create(data.data(), DType::kBFloat16, {7});
  ASSERT_TRUE(vector.ok()) << vector.status();
  EXPECT_EQ(vector->DebugString(), "bf16[7]");
  const absl::StatusOr<TensorView> scalar =
      TensorView::Create(data.data(), DType::kFloat16, {});
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_EQ(scalar->DebugString(), "fp16[]");
}

TEST(TensorViewTest, NumElementsAndSizeBytesFollowDtype) {
  std::vector<uint16_t> data(64 * 32);
  const absl::StatusOr<TensorView> bf16 =
      TensorView::Create(data.data(), DType::kBFloat16, {64, 32});
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ(bf16->num_elements(), 2048);
  EXPECT_EQ(bf16->size_bytes(), 4096u);
  const absl::StatusOr<TensorView> fp16 =
      TensorView::Create(data.data(), DType::kFloat16, {3, 5, 7});
  ASSERT_TRUE(fp16.ok()) << fp16.status();
  EXPECT_EQ(fp16->num_elements(), 105);
  EXPECT_EQ(fp16->size_bytes(), 210u);
  const absl::StatusOr<TensorView> fp32 =
      TensorView::Create(data.data(), DType::kFloat32, {16, 32});
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  EXPECT_EQ(fp32->num_elements(), 512);
  EXPECT_EQ(fp32->size_bytes(), 2048u);
}

TEST(TensorViewTest, DefaultViewIsEmptyFp32) {
  const TensorView view;
  EXPECT_EQ(view.data(), nullptr);
  EXPECT_EQ(view.rank(), 0);
  EXPECT_EQ(view.num_elements(), 0);
  EXPECT_EQ(view.DebugString(), "fp32[]");
}

}  // namespace
}  // namespace muonps
