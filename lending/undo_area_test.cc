#include "lending/undo_area.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace muonps {
namespace {

TEST(UndoAreaLayoutTest, NoMatrixLendsNoBytes) {
  const UndoLayout layout = UndoAreaLayout({});
  EXPECT_TRUE(layout.offsets.empty());
  EXPECT_EQ(layout.bytes, 0);
}

TEST(UndoAreaLayoutTest, SlotsFollowInMatrixOrderEachAlignedTo256Bytes) {
  // 960 fp32 values (3840 bytes: 15 x 256), then 1 value (4 bytes, padded
  // to 256), then 100 (400 bytes, padded to 512), then 64 (exactly 256).
  const UndoLayout layout = UndoAreaLayout({960, 1, 100, 64});
  EXPECT_EQ(layout.offsets, (std::vector<int64_t>{0, 3840, 4096, 4608}));
  EXPECT_EQ(layout.bytes, 4864);
  for (const int64_t offset : layout.offsets) {
    EXPECT_EQ(offset % kUndoSlotAlignment, 0) << offset;
  }
  EXPECT_EQ(layout.bytes % kUndoSlotAlignment, 0);
}

TEST(UndoAreaLayoutTest, EverySlotHoldsItsParameterAsFp32) {
  const std::vector<int64_t> elements = {24 * 40, 10 * 12, 3 * 20 * 20, 7};
  const UndoLayout layout = UndoAreaLayout(elements);
  ASSERT_EQ(layout.offsets.size(), elements.size());
  for (size_t i = 0; i < elements.size(); ++i) {
    const int64_t end =
        i + 1 < elements.size() ? layout.offsets[i + 1] : layout.bytes;
    EXPECT_GE(end - layout.offsets[i], elements[i] * 4) << "slot " << i;
    // No more padding than the alignment needs.
    EXPECT_LT(end - layout.offsets[i], elements[i] * 4 + kUndoSlotAlignment)
        << "slot " << i;
  }
}

TEST(UndoAreaLayoutTest, AnEmptyCountTakesNoBytes) {
  const UndoLayout layout = UndoAreaLayout({0, 64, 0});
  EXPECT_EQ(layout.offsets, (std::vector<int64_t>{0, 0, 256}));
  EXPECT_EQ(layout.bytes, 256);
}

}  // namespace
}  // namespace muonps
