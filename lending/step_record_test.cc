#include "lending/step_record.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace muonps {
namespace {

StepRecord Record(int64_t applied, int64_t applying, int64_t undo) {
  uint64_t words[kStepRecordBytes / sizeof(uint64_t)] = {};
  words[static_cast<int>(StepRecordWord::kApplied)] = StepRecordValue(applied);
  words[static_cast<int>(StepRecordWord::kApplying)] =
      StepRecordValue(applying);
  words[static_cast<int>(StepRecordWord::kUndo)] = StepRecordValue(undo);
  return StepRecordFromWords(words);
}

TEST(StepRecordTest, ZerosSayNothing) {
  const uint64_t words[kStepRecordBytes / sizeof(uint64_t)] = {};
  const StepRecord r = StepRecordFromWords(words);
  EXPECT_EQ(r.applied, -1);
  EXPECT_EQ(r.applying, -1);
  EXPECT_EQ(r.undo, -1);
  EXPECT_EQ(r.torn(), -1);
  EXPECT_EQ(r.undoable(), -1);
}

TEST(StepRecordTest, ATornStepIsUndoableOnlyWhenTheAreaHoldsTheStepBefore) {
  EXPECT_EQ(Record(4, 5, 5).torn(), 5);
  EXPECT_EQ(Record(4, 5, 5).undoable(), 5);
  // The area was being rewritten, or holds another step's parameters.
  EXPECT_EQ(Record(4, 5, -1).undoable(), -1);
  EXPECT_EQ(Record(4, 5, 4).undoable(), -1);
  // Not torn: nothing to take back.
  EXPECT_EQ(Record(5, 5, 5).undoable(), -1);
  // Parameters more than a step behind the torn one.
  EXPECT_EQ(Record(3, 5, 5).undoable(), -1);
}

}  // namespace
}  // namespace muonps
