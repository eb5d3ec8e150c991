// Floods against a real job while it steps: thousands of
// unauthenticated JoinJob and WatchPlan calls from several threads, then
// more authenticated WatchPlan streams than the coordinator allows. Every
// flood call is refused (UNAUTHENTICATED, or RESOURCE_EXHAUSTED past
// --max_watch_streams) without changing anything, the job's steps go on,
// and no worker's lease expires (the plan version does not move: a lost
// lease would re-plan). Loopback only, bounded in count and time.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "muonps/v1/coordinator.grpc.pb.h"
#include "proto/credentials.h"
#include "tests/data_plane_fixture.h"
#include "tests/harness/child_process.h"

namespace muonps {
namespace testing {
namespace {

constexpr int kFloodThreads = 8;
constexpr int kFloodCalls = 2000;  // over all threads
constexpr absl::Duration kFloodBound = absl::Seconds(60);

std::chrono::system_clock::time_point Deadline(absl::Duration d) {
  return std::chrono::system_clock::now() + absl::ToChronoMilliseconds(d);
}

class SecurityFloodTest : public DataPlaneFixture {
 protected:
  int64_t PlanVersion() {
    auto stub = v1::Coordinator::NewStub(TestChannel(coordinator_address()));
    grpc::ClientContext context;
    context.set_deadline(Deadline(absl::Seconds(5)));
    v1::GetPlanRequest request;
    request.set_job(plan().job());
    v1::Plan latest;
    const grpc::Status status = stub->GetPlan(&context, request, &latest);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return latest.version();
  }

  // Steps the job until `done`, expecting every step to succeed; returns
  // how many steps ran.
  int StepUntil(const std::atomic<bool>& done, int64_t* next_step) {
    int steps = 0;
    while (!done.load() || steps == 0) {
      std::vector<std::optional<StepOutcome>> outcomes = RunStep(*next_step);
      for (const std::optional<StepOutcome>& o : outcomes) {
        EXPECT_TRUE(o.has_value() && o->result.ok())
            << "step " << *next_step << ": "
            << (o.has_value() ? o->result.status().ToString() : "no call");
      }
      ++*next_step;
      ++steps;
    }
    return steps;
  }
};

TEST_F(SecurityFloodTest,
       UnauthenticatedJoinsAndWatchesAreRefusedWhileTheJobStepsOnItsLeases) {
  StartJob(SmallModel(scheduler::Layout::kReplicated),
           {.workers = 2, .lease_ttl_ms = 1500, .heartbeat_interval_ms = 300});
  const int64_t version = PlanVersion();
  int64_t step = 0;

  // No token, over TLS (so only the token is missing).
  absl::StatusOr<std::shared_ptr<grpc::Channel>> stranger = OpenChannel(
      coordinator_address(), {.tls_ca_file = TestCredential("ca.pem")});
  ASSERT_TRUE(stranger.ok());
  std::atomic<int> issued{0};
  std::atomic<bool> flood_done{false};
  absl::Mutex mu;
  std::map<grpc::StatusCode, int> codes;
  const absl::Time start = absl::Now();
  std::vector<std::thread> flood;
  for (int t = 0; t < kFloodThreads; ++t) {
    flood.emplace_back([&, t] {
      auto stub = v1::Coordinator::NewStub(*stranger);
      for (int i = issued.fetch_add(1); i < kFloodCalls;
           i = issued.fetch_add(1)) {
        grpc::ClientContext context;
        context.set_deadline(Deadline(absl::Seconds(10)));
        grpc::Status status;
        if (i % 2 == 0) {
          v1::JoinJobRequest join;
          join.set_job(plan().job());
          join.set_worker_id(absl::StrCat("squatter-", t, "-", i));
          join.set_instance_id("x");
          join.mutable_device()->set_kind("cpu");
          join.mutable_device()->set_memory_bytes(int64_t{1} << 40);
          join.set_data_address("10.0.0.1:1");
          v1::JoinJobResponse response;
          status = stub->JoinJob(&context, join, &response);
        } else {
          v1::WatchPlanRequest watch;
          watch.set_job(plan().job());
          auto reader = stub->WatchPlan(&context, watch);
          v1::Plan ignored;
          while (reader->Read(&ignored)) {
          }
          status = reader->Finish();
        }
        absl::MutexLock lock(&mu);
        ++codes[status.error_code()];
      }
    });
  }
  std::thread stepper([&] {
    const int steps = StepUntil(flood_done, &step);
    EXPECT_GT(steps, 0);
  });
  for (std::thread& t : flood) t.join();
  const absl::Duration flood_time = absl::Now() - start;
  flood_done = true;
  stepper.join();

  EXPECT_LT(flood_time, kFloodBound);
  EXPECT_EQ(codes[grpc::StatusCode::UNAUTHENTICATED], kFloodCalls)
      << "every flood call must be refused for its missing token";
  std::cerr << kFloodCalls << " unauthenticated calls refused in "
            << absl::FormatDuration(flood_time) << "\n";
  // Nobody joined, no lease expired: the plan is the one the job started on.
  EXPECT_EQ(PlanVersion(), version);
  EXPECT_EQ(plan().workers_size(), 2);
}

TEST_F(SecurityFloodTest, WatchStreamsPastTheLimitAreRefusedAndLeasesHold) {
  StartJob(SmallModel(scheduler::Layout::kReplicated),
           {.workers = 2, .lease_ttl_ms = 1500, .heartbeat_interval_ms = 300});
  const int64_t version = PlanVersion();
  // The coordinator allows 32 open WatchPlan streams (its default); the
  // two workers hold one each. Open 40 more with the real token and hold
  // them while the job steps for a few lease periods.
  constexpr int kWatches = 40;
  auto stub = v1::Coordinator::NewStub(TestChannel(coordinator_address()));
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::Plan>>> readers;
  int open = 0, refused = 0;
  for (int i = 0; i < kWatches; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    v1::WatchPlanRequest watch;
    watch.set_job(plan().job());
    watch.set_known_version(0);
    readers.push_back(stub->WatchPlan(contexts.back().get(), watch));
    v1::Plan current;
    if (readers.back()->Read(&current)) {
      ++open;  // served: it sent the current plan at once
    } else {
      const grpc::Status status = readers.back()->Finish();
      EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
          << status.error_message();
      EXPECT_NE(status.error_message().find("--max_watch_streams"),
                std::string::npos);
      ++refused;
      readers.back().reset();
    }
  }
  EXPECT_EQ(open, 30);
  EXPECT_EQ(refused, kWatches - 30);
  std::atomic<bool> done{false};
  int64_t step = 0;
  std::thread stepper([&] { StepUntil(done, &step); });
  absl::SleepFor(absl::Milliseconds(3 * 1500));
  done = true;
  stepper.join();
  for (auto& context : contexts) context->TryCancel();
  for (auto& reader : readers) {
    if (reader) reader->Finish();
  }
  EXPECT_EQ(PlanVersion(), version) << "a lease expired during the flood";
}

}  // namespace
}  // namespace testing
}  // namespace muonps
