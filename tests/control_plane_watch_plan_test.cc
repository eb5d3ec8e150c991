// The control plane with real processes on loopback: one muonps-coordinator
// and muonps-worker daemons. Proves that WatchPlan sends the current plan
// version at once and then the next, when a worker joins, on the same
// stream.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <memory>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "muonps/v1/coordinator.grpc.pb.h"
#include "tests/control_plane_fixture.h"

namespace muonps {
namespace {

using control_plane_test::ControlPlaneTest;
using control_plane_test::Deadline;
using control_plane_test::ExitedZero;
using control_plane_test::ExpectCompletePlan;
using control_plane_test::kJob;
using control_plane_test::kWaitTimeout;
using control_plane_test::WorkersOf;

// Keeps a WatchPlan call open; cancels and finishes it however the test
// ends.
struct PlanWatch {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::Plan>> reader;
  ~PlanWatch() {
    if (!reader) return;
    context.TryCancel();
    v1::Plan ignored;
    while (reader->Read(&ignored)) {
    }
    reader->Finish().ok();
  }
};

TEST_F(ControlPlaneTest,
       WatchPlanSendsTheCurrentVersionThenTheNextOnOneStream) {
  ASSERT_NO_FATAL_FAILURE(StartWorker("w0"));
  ASSERT_NO_FATAL_FAILURE(StartWorker("w1"));
  absl::StatusOr<v1::Plan> current = WaitForPlanOf({"w0", "w1"}, kWaitTimeout);
  ASSERT_TRUE(current.ok()) << current.status();

  PlanWatch watch;
  watch.context.set_deadline(Deadline(kWaitTimeout));
  v1::WatchPlanRequest request;
  request.set_job(kJob);
  request.set_worker_id("control-plane-test");
  request.set_known_version(0);
  watch.reader = stub_->WatchPlan(&watch.context, request);
  const absl::Time opened = absl::Now();
  v1::Plan first;
  ASSERT_TRUE(watch.reader->Read(&first));
  // Promptly: it is the current version, not a change to wait for.
  EXPECT_LT(absl::Now() - opened, absl::Seconds(1));
  EXPECT_EQ(first.version(), current->version());
  EXPECT_EQ(WorkersOf(first), (std::set<std::string>{"w0", "w1"}));

  ASSERT_NO_FATAL_FAILURE(StartWorker("w3"));
  v1::Plan next;
  ASSERT_TRUE(watch.reader->Read(&next));
  EXPECT_EQ(next.version(), first.version() + 1);
  EXPECT_EQ(next.reason(), "worker w3 joined");
  ASSERT_NO_FATAL_FAILURE(ExpectCompletePlan(next, {"w0", "w1", "w3"}));

  for (auto& [id, worker] : workers_) worker.process->Signal(SIGTERM);
  for (auto& [id, worker] : workers_) {
    EXPECT_TRUE(ExitedZero(worker.process->Wait(absl::Seconds(5)))) << id;
  }
}

}  // namespace
}  // namespace muonps
