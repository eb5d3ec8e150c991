// PlanDelivery: a plan the engine cannot take is tried again until it is
// taken, and said meanwhile; a newer plan goes first; Stop ends a retry.
#include "server/worker/plan_delivery.h"

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace muonps {
namespace worker {
namespace {

v1::Plan PlanOf(int64_t version) {
  v1::Plan plan;
  plan.set_version(version);
  plan.add_workers("w0");
  return plan;
}

// An engine that refuses each plan its first `refusals[version]` tries,
// and records the tries and the plans taken.
class Engine {
 public:
  explicit Engine(std::map<int64_t, int> refusals)
      : refusals_(std::move(refusals)) {}
  absl::Status Deliver(const v1::Plan& plan) {
    absl::MutexLock lock(&mu_);
    tries_.push_back(plan.version());
    if (refusals_[plan.version()]-- > 0) {
      return absl::UnavailableError(
          "listing the workers' data addresses: "
          "the coordinator is unreachable");
    }
    return absl::OkStatus();
  }
  void Taken(const v1::Plan& plan, int64_t epoch) {
    absl::MutexLock lock(&mu_);
    taken_.push_back({plan.version(), epoch});
  }
  // Waits until `version` was taken; false after 30 s.
  bool WaitTaken(int64_t version) {
    absl::MutexLock lock(&mu_);
    const auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (const auto& [v, e] : taken_) {
        if (v == version) return true;
      }
      return false;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(30));
  }
  std::vector<int64_t> tries() const {
    absl::MutexLock lock(&mu_);
    return tries_;
  }
  std::vector<std::pair<int64_t, int64_t>> taken() const {
    absl::MutexLock lock(&mu_);
    return taken_;
  }

 private:
  mutable absl::Mutex mu_;
  std::map<int64_t, int> refusals_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> tries_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<int64_t, int64_t>> taken_ ABSL_GUARDED_BY(mu_);
};

PlanDelivery DeliveryTo(Engine* engine) {
  return PlanDelivery(
      "job=j worker=w0",
      [engine](const v1::Plan& plan) { return engine->Deliver(plan); },
      [engine](const v1::Plan& plan, int64_t epoch) {
        engine->Taken(plan, epoch);
      });
}

// What `delivery` says once its plan was first refused; nullopt if it was
// not within 30 s.
std::optional<PlanDelivery::Refusal> FirstRefusal(
    const PlanDelivery& delivery) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  std::optional<PlanDelivery::Refusal> refused = delivery.Refused();
  while (!refused.has_value() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
    refused = delivery.Refused();
  }
  return refused;
}

TEST(PlanDeliveryTest, APlanTakenAtOnceIsNeverRefused) {
  Engine engine(std::map<int64_t, int>{});
  PlanDelivery delivery = DeliveryTo(&engine);
  EXPECT_FALSE(delivery.Refused().has_value());
  delivery.Arrived(PlanOf(1), 1);
  ASSERT_TRUE(engine.WaitTaken(1));
  EXPECT_FALSE(delivery.Refused().has_value());
  EXPECT_EQ(engine.taken(), (std::vector<std::pair<int64_t, int64_t>>{{1, 1}}));
}

// Refused three times (the coordinator unreachable for the calls it
// needs): said with its version and reason while it is retried, then taken
// once, and nothing is said any more.
TEST(PlanDeliveryTest, ARefusedPlanIsTriedAgainUntilTaken) {
  Engine engine(std::map<int64_t, int>{{2, 3}});
  PlanDelivery delivery = DeliveryTo(&engine);
  delivery.Arrived(PlanOf(2), 1);
  const std::optional<PlanDelivery::Refusal> refused = FirstRefusal(delivery);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->version, 2);
  EXPECT_TRUE(absl::IsUnavailable(refused->why)) << refused->why;
  EXPECT_NE(refused->why.message().find("data addresses"), std::string::npos);
  ASSERT_TRUE(engine.WaitTaken(2));
  EXPECT_FALSE(delivery.Refused().has_value());
  EXPECT_EQ(engine.tries(), (std::vector<int64_t>{2, 2, 2, 2}));
  EXPECT_EQ(engine.taken(), (std::vector<std::pair<int64_t, int64_t>>{{2, 1}}));
}

// A newer plan that arrives while an older one waits out its backoff is
// tried at once, and the older one never again.
TEST(PlanDeliveryTest, ANewerPlanReplacesOneStillRefused) {
  Engine engine(std::map<int64_t, int>{{3, 1000}});
  PlanDelivery delivery = DeliveryTo(&engine);
  delivery.Arrived(PlanOf(3), 1);
  ASSERT_TRUE(FirstRefusal(delivery).has_value());
  delivery.Arrived(PlanOf(4), 2);
  EXPECT_FALSE(delivery.Refused().has_value()) << "not tried yet";
  ASSERT_TRUE(engine.WaitTaken(4));
  absl::SleepFor(absl::Milliseconds(300));  // past a backoff
  EXPECT_EQ(engine.taken(), (std::vector<std::pair<int64_t, int64_t>>{{4, 2}}));
  const std::vector<int64_t> tries = engine.tries();
  ASSERT_FALSE(tries.empty());
  EXPECT_EQ(tries.back(), 4);
  EXPECT_FALSE(delivery.Refused().has_value());
}

// Stop ends a retry's wait at once and delivers nothing after it.
TEST(PlanDeliveryTest, StopEndsTheRetries) {
  Engine engine(std::map<int64_t, int>{{5, 1000}});
  PlanDelivery delivery = DeliveryTo(&engine);
  delivery.Arrived(PlanOf(5), 1);
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (engine.tries().size() < 5 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  const absl::Time start = absl::Now();
  delivery.Stop();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  const size_t tries = engine.tries().size();
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(engine.tries().size(), tries);
  EXPECT_TRUE(engine.taken().empty());
}

}  // namespace
}  // namespace worker
}  // namespace muonps
