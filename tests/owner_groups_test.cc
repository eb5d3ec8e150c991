// Owner groups with real processes (a coordinator, CPU workers over TCP,
// trainers' clients): workers that say they run on two nodes, two each,
// with every matrix replicated, on a network the coordinator weighs as
// slow (where the groups' step is the shorter), get a plan of two owner
// groups (one per node) that each own every matrix; every update stays
// within its node,
// and training matches the single-process replay bit for bit. A killed
// worker's momentum is not lost: its restarted process gets every copy it
// owns from the other node's owners, with no checkpoint and no reset
// allowed.
#include <gtest/gtest.h>

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "tests/data_plane_fixture.h"

namespace muonps {
namespace {

using testing::ClusterOptions;
using testing::DataPlaneFixture;
using testing::LoopOutcome;
using testing::ModelDecl;
using testing::ReferenceModel;
using testing::SmallModel;
using testing::StepOutcome;

constexpr int kWorkers = 4;
// Every group runs the same fp32 kernels on the same gradients as the
// replay.
constexpr double kExact = 0;

class OwnerGroupsProcessTest : public DataPlaneFixture {
 protected:
  // Workers 0 and 1 on node-a, 2 and 3 on node-b; `steps` steps.
  void StartAndStep(int64_t steps) {
    ClusterOptions cluster = {.workers = kWorkers,
                              .io_timeout_ms = 5000,
                              .lease_ttl_ms = 1500,
                              .heartbeat_interval_ms = 200};
    // 1 MB/s a GPU between nodes: the small model's updates crossing it
    // would cost more than each node computing every one.
    cluster.network_gbs = 0.001;
    for (int w = 0; w < kWorkers; ++w) {
      cluster.worker_node[w] = w < 2 ? "node-a" : "node-b";
    }
    ASSERT_NO_FATAL_FAILURE(StartJob(model_, cluster));
    reference_.emplace(model_, kWorkers, PlannedAlgorithms());
    ASSERT_NO_FATAL_FAILURE(Step(1, steps));
  }
  void Step(int64_t first, int64_t last) {
    for (int64_t step = first; step <= last; ++step) {
      for (const auto& o : RunStep(step)) {
        ASSERT_TRUE(o.has_value() && o->result.ok())
            << "step " << step << ": " << o->result.status();
        EXPECT_EQ(o->result->momentum_reset, 0) << "step " << step;
      }
      ASSERT_TRUE(reference_->Step(step).ok());
    }
  }
  // The plan's groups as worker indices (WorkerIndex), by position.
  std::vector<std::vector<int>> Groups() const {
    std::vector<std::vector<int>> out;
    for (const v1::OwnerGroup& g : plan().owner_groups()) {
      out.emplace_back();
      for (const std::string& id : g.workers()) {
        out.back().push_back(WorkerIndex(id));
      }
    }
    return out;
  }

  const ModelDecl model_ = SmallModel(scheduler::Layout::kReplicated);
  std::optional<ReferenceModel> reference_;
};

TEST_F(OwnerGroupsProcessTest, EachNodeOwnsEveryMatrixAndTrainsAsTheReplay) {
  ASSERT_NO_FATAL_FAILURE(StartAndStep(10));
  EXPECT_EQ(plan().nodes(), 2);
  const std::vector<std::vector<int>> groups = Groups();
  ASSERT_EQ(groups.size(), 2u) << plan().DebugString();
  EXPECT_EQ(std::set<int>(groups[0].begin(), groups[0].end()),
            (std::set<int>{0, 1}));
  EXPECT_EQ(std::set<int>(groups[1].begin(), groups[1].end()),
            (std::set<int>{2, 3}));
  // Owners name the first group's workers; every worker has its batches.
  for (const v1::MatrixPlacement& m : plan().matrices()) {
    for (const std::string& owner : m.owners()) {
      EXPECT_LT(WorkerIndex(owner), 2) << m.name();
    }
  }
  std::set<std::string> batched;
  for (const v1::Batch& b : plan().batches()) batched.insert(b.worker_id());
  EXPECT_EQ(batched.size(), 4u);
  ExpectMatchesReference(*reference_, kExact);
  // Each group keeps a copy of every matrix's momentum, equal to the
  // replay's.
  for (const testing::MatrixDecl& m : model_.matrices) {
    const int owner = Owner(m.name, 0);
    int position = 0;
    while (groups[0][position] != owner) ++position;
    const std::vector<float> expected = reference_->momentum(m.name, 0);
    for (const std::vector<int>& group : groups) {
      const absl::StatusOr<std::vector<float>> held =
          Momentum(group[position], m.name, 0);
      ASSERT_TRUE(held.ok()) << m.name << ": " << held.status();
      EXPECT_EQ(*held, expected) << m.name << " on w" << group[position];
    }
  }
}

// Strict job, no checkpoints: without groups a killed owner's momentum is
// lost and the next step fails (momentum_handover_test). With groups the
// other node holds a copy of everything the killed worker owned: the
// restarted process gets it, and training goes on exactly.
TEST_F(OwnerGroupsProcessTest, AKilledWorkersMomentumComesFromTheOtherNode) {
  ASSERT_NO_FATAL_FAILURE(StartAndStep(3));
  ASSERT_NO_FATAL_FAILURE(KillWorker(1));
  ASSERT_NO_FATAL_FAILURE(RestartWorker(1));
  const absl::Status planned = WaitForFullPlan(absl::Seconds(20));
  ASSERT_TRUE(planned.ok()) << planned;
  ASSERT_EQ(Groups().size(), 2u) << plan().DebugString();
  const std::vector<LoopOutcome> loops = RunTrainerLoops(4, 8, 3);
  for (int r = 0; r < trainers(); ++r) {
    ASSERT_TRUE(loops[r].finished)
        << "trainer " << r << ": " << loops[r].attempts.back().result.status();
    for (const StepOutcome& o : loops[r].attempts) {
      if (o.result.ok()) {
        EXPECT_EQ(o.result->momentum_reset, 0);
      }
    }
  }
  for (int64_t step = 4; step <= 8; ++step) {
    ASSERT_TRUE(reference_->Step(step).ok());
  }
  ExpectMatchesReference(*reference_, kExact);
  // The restarted process got what it owns by the handover.
  const std::string log = WorkerLog(1);
  EXPECT_TRUE(absl::StrContains(log, "momentum handover: sent 0, received"))
      << log;
  EXPECT_FALSE(absl::StrContains(log, "lost their previous owner")) << log;
}

}  // namespace
}  // namespace muonps
