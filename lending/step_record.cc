#include "lending/step_record.h"

namespace muonps {
namespace {

int64_t StepOf(uint64_t value) { return static_cast<int64_t>(value) - 1; }

}  // namespace

StepRecord StepRecordFromWords(const uint64_t* words) {
  StepRecord out;
  out.applied = StepOf(words[static_cast<int>(StepRecordWord::kApplied)]);
  out.applying = StepOf(words[static_cast<int>(StepRecordWord::kApplying)]);
  out.decided = StepOf(words[static_cast<int>(StepRecordWord::kDecided)]);
  out.decider = words[static_cast<int>(StepRecordWord::kDecider)];
  return out;
}

}  // namespace muonps
