// The coordinator's locking: planning (and storing) runs on a copy outside
// the mutex, so heartbeats and other reads keep their pace while a big job
// re-plans, and concurrent membership changes still end in plans that hold
// them all.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/sanitizer.h"
#include "gtest/gtest.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/job_store.h"
#include "server/coordinator/served_coordinator.h"

namespace muonps {
namespace coordinator {
namespace {

using coordinator_test::ServedCoordinator;

v1::JoinJobRequest Join(const std::string& job, const std::string& worker) {
  v1::JoinJobRequest r;
  r.set_job(job);
  r.set_worker_id(worker);
  r.set_instance_id("i-" + worker);
  r.mutable_device()->set_kind("cpu");
  r.mutable_device()->set_memory_bytes(int64_t{64} << 30);
  return r;
}

// `count` small matrices of four shapes, ten per layer.
v1::CreateJobRequest ManyMatrices(const std::string& job, int count) {
  v1::CreateJobRequest r;
  r.mutable_job()->set_name(job);
  for (int i = 0; i < count; ++i) {
    v1::Matrix* m = r.mutable_job()->add_matrices();
    m->set_name(absl::StrCat("layers.", i / 10, ".w", i % 10));
    m->set_rows(64 + (i % 4) * 32);
    m->set_cols(64);
    m->set_layer(i / 10);
  }
  return r;
}

double Ms(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

// Matrices of the big job. AddressSanitizer plans about 15x slower (seconds
// per re-plan of 10^5): there a fifth of them still takes far longer than
// half a period, and keeps the test well under a minute.
constexpr int kBigJobMatrices = kAddressSanitizer ? 20000 : 100000;

// One heartbeat period of the test. A re-plan of 10^5 matrices takes 0.3 to
// 0.5 s on two cores (more under sanitizers): a heartbeat that waited for
// one would take longer than half a period.
constexpr absl::Duration kPeriod = absl::Milliseconds(300);

// In memory, and over a JobStore (whose commits of multi-megabyte plans,
// fsync included, run outside the mutex too).
class CoordinatorLockingTest : public ::testing::TestWithParam<bool> {
 protected:
  ~CoordinatorLockingTest() override {
    std::error_code ignored;
    if (!root_.empty()) std::filesystem::remove_all(root_, ignored);
  }
  std::unique_ptr<ServedCoordinator> NewState(const CoordinatorOptions& o) {
    if (!GetParam()) return std::make_unique<ServedCoordinator>(o);
    const char* tmp = std::getenv("TEST_TMPDIR");
    root_ = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/locking_XXXXXX");
    EXPECT_NE(mkdtemp(root_.data()), nullptr);
    absl::StatusOr<std::unique_ptr<JobStore>> store =
        JobStore::Open(root_ + "/state");
    EXPECT_TRUE(store.ok()) << store.status();
    if (!store.ok()) return nullptr;
    absl::StatusOr<std::unique_ptr<ServedCoordinator>> state =
        ServedCoordinator::Open(o, *std::move(store));
    EXPECT_TRUE(state.ok()) << state.status();
    return state.ok() ? *std::move(state) : nullptr;
  }
  std::string root_;
};

INSTANTIATE_TEST_SUITE_P(InMemoryAndDurable, CoordinatorLockingTest,
                         ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "WithStateDir" : "InMemory";
                         });

TEST_P(CoordinatorLockingTest,
       HeartbeatsAreAnsweredWithinHalfAPeriodWhileA100kMatrixJobReplans) {
  CoordinatorOptions options;
  options.lease_ttl = absl::Seconds(60);
  options.heartbeat_interval = kPeriod;
  std::unique_ptr<ServedCoordinator> owned = NewState(options);
  ASSERT_NE(owned, nullptr);
  ServedCoordinator& state = *owned;
  ASSERT_TRUE(state.CreateJob(ManyMatrices("big", kBigJobMatrices)).ok());
  absl::StatusOr<v1::JoinJobResponse> first = state.JoinJob(Join("big", "w0"));
  ASSERT_TRUE(first.ok()) << first.status();

  std::atomic<bool> planning{false};
  absl::Notification done;
  std::vector<double> latencies_ms;
  int during_planning = 0;
  std::thread heartbeats([&] {
    v1::HeartbeatRequest beat;
    beat.set_job("big");
    beat.set_worker_id("w0");
    beat.set_instance_id("i-w0");
    beat.set_worker_token(first->worker_token());
    v1::ListWorkersRequest list;
    list.set_job("big");
    // Far more often than once a period, so that many land in re-plans.
    while (!done.WaitForNotificationWithTimeout(absl::Milliseconds(10))) {
      const bool busy = planning.load();
      const auto start = std::chrono::steady_clock::now();
      const absl::StatusOr<v1::HeartbeatResponse> answer =
          state.Heartbeat(beat);
      const absl::StatusOr<v1::ListWorkersResponse> workers =
          state.ListWorkers(list);
      latencies_ms.push_back(Ms(std::chrono::steady_clock::now() - start));
      EXPECT_TRUE(answer.ok()) << answer.status();
      EXPECT_TRUE(workers.ok()) << workers.status();
      if (busy && planning.load()) ++during_planning;
    }
  });
  // Workers come and go: every change re-plans all 10^5 matrices.
  int64_t last_version = first->plan_version();
  std::string w2_token;
  for (const char* w : {"w1", "w2", "w3"}) {
    planning = true;
    const absl::StatusOr<v1::JoinJobResponse> joined =
        state.JoinJob(Join("big", w));
    planning = false;
    ASSERT_TRUE(joined.ok()) << joined.status();
    EXPECT_GT(joined->plan_version(), last_version);
    last_version = joined->plan_version();
    if (std::string(w) == "w2") w2_token = joined->worker_token();
  }
  v1::LeaveJobRequest leave;
  leave.set_job("big");
  leave.set_worker_id("w2");
  leave.set_instance_id("i-w2");
  leave.set_worker_token(w2_token);
  planning = true;
  const absl::Status left = state.LeaveJob(leave).status();
  planning = false;
  EXPECT_TRUE(left.ok()) << left;
  done.Notify();
  heartbeats.join();

  ASSERT_FALSE(latencies_ms.empty());
  const double worst =
      *std::max_element(latencies_ms.begin(), latencies_ms.end());
  // The test means something only if heartbeats overlapped re-plans.
  EXPECT_GE(during_planning, 5) << "re-plans were too quick to overlap";
  EXPECT_LT(worst, absl::ToDoubleMilliseconds(kPeriod / 2))
      << "a heartbeat waited " << worst << " ms (" << latencies_ms.size()
      << " heartbeats, " << during_planning << " during re-plans)";
}

TEST_P(CoordinatorLockingTest,
       ConcurrentJoinsEachGetAPlanVersionThatHoldsThem) {
  CoordinatorOptions options;
  options.lease_ttl = absl::Seconds(60);
  std::unique_ptr<ServedCoordinator> owned = NewState(options);
  ASSERT_NE(owned, nullptr);
  ServedCoordinator& state = *owned;
  ASSERT_TRUE(state.CreateJob(ManyMatrices("job", 2000)).ok());
  constexpr int kWorkers = 8;
  std::vector<absl::StatusOr<v1::JoinJobResponse>> joined(
      kWorkers, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < kWorkers; ++i) {
    threads.emplace_back([&, i] {
      joined[i] = state.JoinJob(Join("job", absl::StrCat("w", i)));
    });
  }
  for (std::thread& t : threads) t.join();
  int64_t latest = 0;
  for (int i = 0; i < kWorkers; ++i) {
    ASSERT_TRUE(joined[i].ok()) << "w" << i << ": " << joined[i].status();
    v1::GetPlanRequest get;
    get.set_job("job");
    get.set_version(joined[i]->plan_version());
    const absl::StatusOr<v1::Plan> plan = state.GetPlan(get);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const std::set<std::string> members(plan->workers().begin(),
                                        plan->workers().end());
    EXPECT_EQ(members.count(absl::StrCat("w", i)), 1u)
        << "plan_version " << plan->version() << " lacks w" << i;
    latest = std::max(latest, joined[i]->plan_version());
  }
  v1::GetPlanRequest get;
  get.set_job("job");
  const absl::StatusOr<v1::Plan> current = state.GetPlan(get);
  ASSERT_TRUE(current.ok()) << current.status();
  EXPECT_EQ(current->version(), latest);
  EXPECT_EQ(current->workers_size(), kWorkers);
  // Changes that arrived during a plan share the next version.
  EXPECT_LE(latest, kWorkers);
}

}  // namespace
}  // namespace coordinator
}  // namespace muonps
