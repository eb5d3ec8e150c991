// PlanReplyCache: a plan version is converted once and its message shared,
// a job's newer version replaces its older ones, a plan its job no longer
// keeps is dropped, and a job created again under the same name and
// version gets its own message.
#include "server/coordinator/plan_reply_cache.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace muonps {
namespace coordinator {
namespace {

std::shared_ptr<const PublishedPlan> PlanOf(const std::string& job,
                                            int64_t version,
                                            const std::string& reason) {
  auto plan = std::make_shared<PublishedPlan>();
  plan->job = job;
  plan->version = version;
  plan->reason = reason;
  plan->matrices = std::make_shared<const std::vector<scheduler::MatrixSpec>>();
  plan->ownership.worker_ids = {"w0"};
  plan->ownership.worker_seconds = {0};
  plan->ownership.worker_memory_bytes = {0};
  plan->ownership.worker_momentum_bytes = {0};
  plan->ownership.worker_link_bytes = {0};
  return plan;
}

TEST(PlanReplyCacheTest, AVersionIsConvertedOnceAndShared) {
  PlanReplyCache cache;
  const auto plan = PlanOf("x", 3, "worker w0 joined");
  const std::shared_ptr<const v1::Plan> first = cache.Reply(plan);
  EXPECT_EQ(first->name(), "jobs/x/plans/3");
  EXPECT_EQ(first->reason(), "worker w0 joined");
  EXPECT_EQ(cache.Reply(plan), first);
}

TEST(PlanReplyCacheTest, AJobCreatedAgainGetsItsOwnMessageForTheSameVersion) {
  PlanReplyCache cache;
  const auto old_job = PlanOf("x", 1, "old");
  const std::shared_ptr<const v1::Plan> old_reply = cache.Reply(old_job);
  const auto new_job = PlanOf("x", 1, "new");
  const std::shared_ptr<const v1::Plan> new_reply = cache.Reply(new_job);
  EXPECT_NE(new_reply, old_reply);
  EXPECT_EQ(new_reply->reason(), "new");
}

TEST(PlanReplyCacheTest, NewerVersionsAndDroppedPlansLeaveTheCache) {
  PlanReplyCache cache;
  const auto first = PlanOf("x", 1, "a");
  const std::shared_ptr<const v1::Plan> first_reply = cache.Reply(first);
  const auto second = PlanOf("x", 2, "b");
  cache.Reply(second);
  // Version 2 of "x" replaced version 1: asked again, it is converted again.
  EXPECT_NE(cache.Reply(first), first_reply);
  // A plan its job no longer keeps is dropped at the next conversion.
  std::weak_ptr<const v1::Plan> dropped;
  {
    const auto pruned = PlanOf("y", 1, "c");
    dropped = cache.Reply(pruned);
  }
  cache.Reply(PlanOf("z", 1, "d"));
  EXPECT_TRUE(dropped.expired());
}

}  // namespace
}  // namespace coordinator
}  // namespace muonps
