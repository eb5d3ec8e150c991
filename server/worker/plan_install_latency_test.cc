// Installing a big plan never holds the engine's lock for long: a trainer's
// Attach (which takes the lock), the status reads and StopStepping (what
// SIGTERM's drain takes) answer within 200 ms while SetPlan installs a plan
// of 10^5 matrices, or one 4096 x 14336 matrix, on the CPU: allocation and
// zero-fill of the stacks happen before SetPlan takes the lock.
#include <atomic>
#include <iostream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/worker/step_backend.h"
#include "server/worker/step_engine.h"
#include "server/worker/step_engine_fixture.h"

namespace muonps {
namespace worker {
namespace {

struct Shape {
  int64_t count, rows, cols;
};

// The job and its one-worker plan: `shape.count` matrices, all on w0.
std::pair<v1::JobSpec, v1::Plan> OneWorkerJob(const Shape& shape) {
  v1::JobSpec job;
  job.set_name("install-latency");
  job.mutable_muon()->set_lr(0.02);
  v1::Plan plan;
  plan.set_version(1);
  plan.add_workers("w0");
  for (int64_t i = 0; i < shape.count; ++i) {
    v1::Matrix* m = job.add_matrices();
    m->set_name(absl::StrCat("layers.", i, ".w"));
    m->set_rows(shape.rows);
    m->set_cols(shape.cols);
    v1::MatrixPlacement* p = plan.add_matrices();
    p->set_name(m->name());
    p->add_owners("w0");
  }
  return {job, plan};
}

class PlanInstallLatencyTest : public ::testing::TestWithParam<Shape> {};

TEST_P(PlanInstallLatencyTest, CallsThatTakeTheLockAnswerWhileAPlanInstalls) {
  const Shape shape = GetParam();
  StepEngine engine(
      "w0", CpuStepBackend(absl::Seconds(10)),
      [](int, const std::vector<std::string>&, uint64_t, const std::string&)
          -> absl::StatusOr<std::unique_ptr<transport::Transport>> {
        return absl::UnavailableError("no transport in this test");
      });
  // Not a structured binding: clang's lambdas cannot capture one (C++17).
  const std::pair<v1::JobSpec, v1::Plan> job_and_plan = OneWorkerJob(shape);
  const v1::JobSpec& job = job_and_plan.first;
  const v1::Plan& plan = job_and_plan.second;
  std::atomic<bool> installing{true};
  absl::Status installed;
  absl::Duration install_time;
  std::thread install([&] {
    const absl::Time start = absl::Now();
    installed = SetPlanFromProto(engine, job, plan, {{"w0", "127.0.0.1:1"}});
    install_time = absl::Now() - start;
    installing.store(false);
  });
  v1::AttachRequest attach;
  attach.set_trainer_rank(0);
  attach.set_trainer_count(1);
  absl::Duration slowest;
  int calls = 0;
  while (installing.load()) {
    const absl::Time start = absl::Now();
    (void)AttachFromProto(engine, attach);
    (void)engine.last_step();
    (void)engine.last_checkpoint_step();
    slowest = std::max(slowest, absl::Now() - start);
    ++calls;
    absl::SleepFor(absl::Milliseconds(5));
  }
  install.join();
  ASSERT_TRUE(installed.ok()) << installed;
  std::cerr << shape.count << " x " << shape.rows << " x " << shape.cols
            << ": SetPlan took " << install_time << "; " << calls
            << " rounds of Attach and the status reads meanwhile, the "
               "slowest "
            << slowest << "\n";
  EXPECT_LT(slowest, absl::Milliseconds(200));
  // StopStepping (the drain's last act) waits only for a step.
  const absl::Time start = absl::Now();
  engine.StopStepping("leaving");
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(200));
}

INSTANTIATE_TEST_SUITE_P(BigPlans, PlanInstallLatencyTest,
                         ::testing::Values(Shape{100000, 8, 8},
                                           Shape{1, 4096, 14336}));

}  // namespace
}  // namespace worker
}  // namespace muonps
