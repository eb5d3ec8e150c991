// Tests of measured_steps.h: parsing the measured step lines and per-rank
// timelines that bench/scale_sim validates its clock against.
#include "bench/scale_sim/measured_steps.h"

#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace muonps {
namespace bench {
namespace {

using scheduler::Layout;
using ::testing::HasSubstr;

TEST(MeasuredStepsTest, KeepsOnlyNGpuStepLines) {
  const auto steps = ParseMeasuredSteps(
      "# a comment\n"
      "{\"what\":\"muonps_ns_all\",\"ms\":167}\n"
      "{\"what\":\"muonps_step_1gpu\",\"ms\":175.3}\n"
      "{\"what\":\"muonps_step_1gpu_2workers\",\"ms\":184.2}\n"
      "{\"what\":\"muonps_step_return\",\"ms\":0.1}\n"
      "\n"
      "{\"what\":\"muonps_step_4gpu\",\"ms\":60,\"layout\":\"unreduced\","
      "\"predicted_ms\":55}\n");
  ASSERT_TRUE(steps.ok()) << steps.status();
  ASSERT_EQ(steps->size(), 2u);
  EXPECT_EQ((*steps)[0].gpus, 1);
  EXPECT_EQ((*steps)[0].layout, Layout::kReplicated);
  EXPECT_EQ((*steps)[0].line, 3);
  EXPECT_FALSE((*steps)[0].predicted_ms.has_value());
  EXPECT_EQ((*steps)[1].gpus, 4);
  EXPECT_EQ((*steps)[1].layout, Layout::kUnreduced);
  EXPECT_EQ((*steps)[1].ms, 60);
  EXPECT_EQ((*steps)[1].predicted_ms, 55);
}

TEST(MeasuredStepsTest, MalformedLinesNameTheLine) {
  EXPECT_THAT(ParseMeasuredSteps("{}\nnot json\n").status().message(),
              HasSubstr("--measured line 2"));
  EXPECT_THAT(
      ParseMeasuredSteps("{\"what\":\"muonps_step_2gpu\"}").status().message(),
      HasSubstr("ms must be"));
  EXPECT_THAT(ParseMeasuredSteps("{\"what\":\"muonps_step_2gpu\",\"ms\":1,"
                                 "\"layout\":\"fsdp\"}")
                  .status()
                  .message(),
              HasSubstr("layout"));
  EXPECT_EQ(LoadMeasuredSteps("/nonexistent").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MeasuredStepsTest, TimelinesGiveEachRanksLastMarks) {
  const auto timelines = ParseMeasuredTimelines(
      "{\"what\":\"muonps_step_4gpu\",\"ms\":60}\n"
      "{\"what\":\"muonps_step_timeline\",\"layout\":\"unreduced\","
      "\"gpus\":4,\"rank\":1,\"host_ms\":{\"agreed\":4,\"staged\":50,"
      "\"committed\":60},\"marks\":[[\"begin\",-1,0],[\"to_owners\",0,1],"
      "[\"to_owners\",1,2],[\"compute\",3,20],[\"from_owners\",0,21],"
      "[\"compute\",1,30],[\"from_owners\",1,31]]}\n");
  ASSERT_TRUE(timelines.ok()) << timelines.status();
  ASSERT_EQ(timelines->size(), 1u);
  const MeasuredTimeline& t = (*timelines)[0];
  EXPECT_EQ(t.gpus, 4);
  EXPECT_EQ(t.rank, 1);
  EXPECT_EQ(t.layout, Layout::kUnreduced);
  EXPECT_EQ(t.agreed_ms, 4);
  EXPECT_EQ(t.staged_ms, 50);
  EXPECT_EQ(t.committed_ms, 60);
  EXPECT_EQ(t.gradients_landed_ms, 2);
  EXPECT_EQ(t.compute_end_ms, 30);
  EXPECT_EQ(t.updates_landed_ms, 31);
  EXPECT_EQ(t.stacks, (std::vector<int>{3, 1}));
  EXPECT_EQ(t.line, 2);
  EXPECT_EQ(t.workers, 1);
  // Workers sharing the GPUs say how many.
  const auto shared = ParseMeasuredTimelines(
      "{\"what\":\"muonps_step_timeline\",\"gpus\":1,\"workers\":2,"
      "\"rank\":1,\"host_ms\":{\"agreed\":1,\"staged\":2,"
      "\"committed\":3},\"marks\":[]}");
  ASSERT_TRUE(shared.ok()) << shared.status();
  EXPECT_EQ((*shared)[0].workers, 2);
  EXPECT_THAT(
      ParseMeasuredTimelines("{\"what\":\"muonps_step_timeline\",\"gpus\":1,"
                             "\"workers\":0,\"rank\":0}")
          .status()
          .message(),
      HasSubstr("workers"));
  EXPECT_THAT(
      ParseMeasuredTimelines("{\"what\":\"muonps_step_timeline\",\"gpus\":2,"
                             "\"rank\":0,\"host_ms\":{},\"marks\":[]}")
          .status()
          .message(),
      HasSubstr("host_ms.agreed"));
}

}  // namespace
}  // namespace bench
}  // namespace muonps
