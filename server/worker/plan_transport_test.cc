// PlanTransport's way out of a plan version: aborted at once by a plan that
// drops one of its workers, and, by one that keeps them all, only once a
// round has waited past keep_for without the step thread moving on.
#include "server/worker/plan_transport.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "transport/accepting_transport.h"

namespace muonps {
namespace worker {
namespace {

// Accepts everything; remembers whether it was aborted and why.
class RecordingTransport : public transport::AcceptingTransport {
 public:
  explicit RecordingTransport(absl::Status* aborted)
      : AcceptingTransport(0, 2), aborted_(aborted) {}
  void Abort(const absl::Status& reason) override {
    absl::MutexLock lock(&mu_);
    *aborted_ = reason;
  }
  static absl::Mutex mu_;

 private:
  absl::Status* const aborted_;
};
absl::Mutex RecordingTransport::mu_;

class PlanTransportTest : public ::testing::Test {
 protected:
  static constexpr absl::Duration kKeepFor = absl::Milliseconds(200);

  PlanTransportTest()
      : transport_("w0", Device{}, Factory(&aborted_), kKeepFor) {
    transport_.SetSecret("a data-plane secret of thirty-two bytes!");
    transport_.Publish(2, {"w0", "w1"});
    bool built = false;
    EXPECT_TRUE(
        transport_.Ensure(0, {"a:1", "b:1"}, 2, absl::OkStatus(), &built).ok());
    EXPECT_TRUE(built);
  }
  static TransportFactory Factory(absl::Status* aborted) {
    return [aborted](int, const std::vector<std::string>&, uint64_t,
                     const std::string&)
               -> absl::StatusOr<std::unique_ptr<transport::Transport>> {
      return std::make_unique<RecordingTransport>(aborted);
    };
  }
  absl::Status Aborted() {
    absl::MutexLock lock(&RecordingTransport::mu_);
    return aborted_;
  }

  absl::Status aborted_;  // OK until the transport is aborted
  PlanTransport transport_;
};

TEST_F(PlanTransportTest, APlanDroppingAWorkerAbortsAtOnce) {
  EXPECT_TRUE(transport_.AbortFor({3, {"w0"}, "lease expired: w1"}));
  EXPECT_TRUE(absl::IsUnavailable(Aborted())) << Aborted();
  EXPECT_NE(Aborted().message().find("worker \"w1\" left the job"),
            std::string::npos)
      << Aborted();
}

// A round of version 2 still waiting once keep_for has passed: a peer that
// was idle when version 3 came moved to it and will never join the round.
TEST_F(PlanTransportTest,
       APlanKeepingEveryWorkerAbortsARoundStillWaitingLater) {
  const absl::Time arrived = absl::Now();
  EXPECT_FALSE(transport_.AbortFor({3, {"w0", "w1"}, "worker w2 joined"}));
  EXPECT_TRUE(Aborted().ok()) << "aborted at once: " << Aborted();
  EXPECT_TRUE(transport_.Replaced().ok());
  while (Aborted().ok() && absl::Now() - arrived < absl::Seconds(10)) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_GE(absl::Now() - arrived, kKeepFor);
  ASSERT_TRUE(absl::IsUnavailable(Aborted())) << Aborted();
  EXPECT_NE(Aborted().message().find("which keeps every worker"),
            std::string::npos)
      << Aborted();
  EXPECT_NE(Aborted().message().find("(worker w2 joined)"), std::string::npos)
      << Aborted();
  // No step of version 2 starts after that; version 3 is free to.
  EXPECT_TRUE(absl::IsUnavailable(transport_.Replaced()));
  transport_.Drop(Aborted());
  transport_.Publish(3, {"w0", "w1"});
  EXPECT_TRUE(transport_.Replaced().ok());
}

// The step thread moved on (the round ended, the new version was set)
// before keep_for: nothing is aborted.
TEST_F(PlanTransportTest, APlanKeepingEveryWorkerLeavesARoundThatEndsInTime) {
  EXPECT_FALSE(transport_.AbortFor({3, {"w0", "w1"}, ""}));
  transport_.Drop(absl::CancelledError("plan version 3 replaced it"));
  transport_.Publish(3, {"w0", "w1"});
  // The drop itself aborts: clear it, then wait past keep_for.
  {
    absl::MutexLock lock(&RecordingTransport::mu_);
    aborted_ = absl::OkStatus();
  }
  absl::SleepFor(3 * kKeepFor);
  EXPECT_TRUE(Aborted().ok()) << Aborted();
  EXPECT_TRUE(transport_.Replaced().ok());
}

// A coordinator restarted without its state creates the job again, whose
// versions start over below the old ones: what superseded the old job's
// versions says nothing about the new job's, whose transport is not
// aborted (it was, keep_for after it was built, naming the old job's
// version).
TEST_F(PlanTransportTest, VersionsGoingBackwardsForgetTheOldJobsNewerPlans) {
  EXPECT_FALSE(transport_.AbortFor({4, {"w0", "w1"}, "worker w2 joined"}));
  transport_.Drop(absl::CancelledError("plan version 5 replaced it"));
  transport_.Publish(5, {"w0", "w1"});
  transport_.Drop(absl::CancelledError("the job was created again"));
  transport_.Publish(2, {"w0", "w1"});
  {
    absl::MutexLock lock(&RecordingTransport::mu_);
    aborted_ = absl::OkStatus();
  }
  bool built = false;
  ASSERT_TRUE(
      transport_.Ensure(0, {"a:1", "b:1"}, 2, absl::OkStatus(), &built).ok());
  EXPECT_TRUE(built);
  absl::SleepFor(3 * kKeepFor);
  EXPECT_TRUE(Aborted().ok()) << Aborted();
  EXPECT_TRUE(transport_.Replaced().ok());
}

// A step that comes while a newer plan keeping every worker is on its way
// in waits for it to be published; one that comes with none pending, or
// after a plan that drops a worker (refused at once, naming it), does not
// wait.
TEST_F(PlanTransportTest, AStepWaitsForAPlanKeepingEveryWorkerToBePublished) {
  EXPECT_TRUE(transport_.AwaitPublished(absl::ZeroDuration()));
  const PlanMembership next{3, {"w0", "w1"}, "worker w2 joined"};
  EXPECT_FALSE(transport_.AbortFor(next));
  EXPECT_FALSE(transport_.AwaitPublished(absl::Milliseconds(20)));
  const absl::Time start = absl::Now();
  std::thread install([&] {
    absl::SleepFor(absl::Milliseconds(50));
    transport_.Drop(absl::CancelledError("plan version 3 replaced it"));
    transport_.Publish(next.version, next.workers);
  });
  EXPECT_TRUE(transport_.AwaitPublished(absl::Seconds(30)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));
  install.join();
  EXPECT_TRUE(transport_.Replaced().ok()) << transport_.Replaced();
  EXPECT_TRUE(transport_.AwaitPublished(absl::ZeroDuration()));

  EXPECT_TRUE(transport_.AbortFor({4, {"w0"}, "lease expired: w1"}));
  EXPECT_TRUE(transport_.AwaitPublished(absl::ZeroDuration()));
  EXPECT_TRUE(absl::IsUnavailable(transport_.Replaced()));
}

}  // namespace
}  // namespace worker
}  // namespace muonps
