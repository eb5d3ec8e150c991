// A partition between two workers, with real processes: the coordinator and
// worker 0 listen on the host end of a network namespace's link
// (tests/harness/network_namespace.h), worker 1 runs inside the namespace,
// two trainer ranks step a model of every layout. The test then drops every
// TCP packet across the link except those of the coordinator's port: the
// workers cannot reach each other, while worker 1 keeps its lease. Both
// trainers' Step fails within the I/O timeout with a named error, no lease
// expires, and once the link is healed the trainers' retries finish the step
// exactly once: parameters, momentum and AdamW equal a failure-free run.
// Needs root, `ip` and `iptables` (skips without them); "exclusive", as the
// namespace's subnet is fixed (the test certificate names its address).
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/time/time.h"
#include "tests/data_plane_fixture.h"
#include "tests/harness/network_namespace.h"

namespace muonps {
namespace {

using testing::ClusterOptions;
using testing::DataPlaneFixture;
using testing::LoopOutcome;
using testing::NetworkNamespace;
using testing::ReferenceModel;
using testing::StepOutcome;

constexpr int kSubnet = 77;  // 10.231.77.1: in //tests/testdata:tls
constexpr int kWorkers = 2;
constexpr int64_t kIoTimeoutMs = 1500;
constexpr absl::Duration kIoTimeout = absl::Milliseconds(kIoTimeoutMs);
// Scheduling and the gRPC hop on a loaded two-core machine.
constexpr absl::Duration kMargin = absl::Seconds(3);
constexpr double kTolerance = 1e-5;

class PartitionChaosTest : public DataPlaneFixture {};

TEST_F(PartitionChaosTest, StepsFailNamedThenFinishOnceWhenTheLinkHeals) {
  absl::StatusOr<std::unique_ptr<NetworkNamespace>> ns =
      NetworkNamespace::Create(kSubnet);
  if (absl::IsFailedPrecondition(ns.status())) GTEST_SKIP() << ns.status();
  ASSERT_TRUE(ns.ok()) << ns.status();
  ClusterOptions options{.workers = kWorkers,
                         .io_timeout_ms = kIoTimeoutMs,
                         .lease_ttl_ms = 8000,
                         .heartbeat_interval_ms = 300};
  options.host = (*ns)->host_address();
  options.worker_host[1] = (*ns)->inside_address();
  options.worker_wrapper[1] = (*ns)->Wrap({});
  const testing::ModelDecl model = testing::MixedModel();
  ASSERT_NO_FATAL_FAILURE(StartJob(model, options));
  ReferenceModel reference(model, kWorkers, PlannedAlgorithms());
  for (int64_t step = 1; step <= 2; ++step) {
    for (const std::optional<StepOutcome>& o : RunStep(step)) {
      ASSERT_TRUE(o.has_value() && o->result.ok())
          << "step " << step << ": " << o->result.status();
    }
    ASSERT_TRUE(reference.Step(step).ok());
  }

  int port = 0;
  const std::string& address = coordinator_address();
  ASSERT_TRUE(absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port));
  const absl::Status cut = (*ns)->Partition({port});
  ASSERT_TRUE(cut.ok()) << cut;
  const std::vector<std::optional<StepOutcome>> cut_off = RunStep(3);
  for (int r = 0; r < kWorkers; ++r) {
    ASSERT_TRUE(cut_off[r].has_value());
    const absl::Status& s = cut_off[r]->result.status();
    EXPECT_FALSE(s.ok()) << "trainer " << r << " stepped across a partition";
    EXPECT_TRUE(absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s))
        << "trainer " << r << ": " << s;
    EXPECT_FALSE(s.message().empty());
    EXPECT_LE(cut_off[r]->elapsed, 2 * kIoTimeout + kMargin)
        << "trainer " << r << ": " << s;
  }
  // The partitioned worker still reaches the coordinator: its lease holds.
  for (int w = 0; w < kWorkers; ++w) {
    absl::StatusOr<v1::WorkerStatus> status = WorkerStatus(w);
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_EQ(status->plan_version(), plan().version()) << "worker " << w;
  }

  const absl::Status healed = (*ns)->Heal();
  ASSERT_TRUE(healed.ok()) << healed;
  const std::vector<LoopOutcome> loops = RunTrainerLoops(3, 5, 6);
  for (int r = 0; r < kWorkers; ++r) {
    ASSERT_TRUE(loops[r].finished)
        << "trainer " << r << ": " << loops[r].attempts.back().result.status();
  }
  for (int64_t step = 3; step <= 5; ++step) {
    ASSERT_TRUE(reference.Step(step).ok());
  }
  ExpectMatchesReference(reference, kTolerance);
  for (int w = 0; w < kWorkers; ++w) {
    absl::StatusOr<v1::WorkerStatus> status = WorkerStatus(w);
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_EQ(status->plan_version(), plan().version()) << "worker " << w;
  }
}

}  // namespace
}  // namespace muonps
