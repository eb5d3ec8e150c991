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
#include <signal.h>

#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "tests/data_plane_fixture.h"
#include "tests/harness/child_process.h"

namespace muonps {
namespace {

using testing::ClusterOptions;
using testing::DataPlaneFixture;
using testing::LoopOutcome;
using testing::LoopProgress;
using testing::ModelDecl;
using testing::ReferenceModel;
using testing::RetryingLoop;
using testing::SmallModel;
using testing::StepOutcome;

constexpr int kWorkers = 4;
// Every group runs the same fp32 kernels on the same gradients as the
// replay.
constexpr double kExact = 0;

class OwnerGroupsProcessTest : public DataPlaneFixture {
 protected:
  // Workers 0 and 1 on node-a, 2 and 3 on node-b, each with `flags`;
  // `steps` steps.
  void StartAndStep(int64_t steps, const std::string& checkpoint_dir = "",
                    const std::vector<std::string>& flags = {}) {
    ClusterOptions cluster = {.workers = kWorkers,
                              .io_timeout_ms = 5000,
                              .lease_ttl_ms = 1500,
                              .heartbeat_interval_ms = 200};
    cluster.checkpoint_dir = checkpoint_dir;
    cluster.checkpoint_every = checkpoint_dir.empty() ? 0 : 1;
    // 1 MB/s a GPU between nodes: the small model's updates crossing it
    // would cost more than each node computing every one.
    cluster.network_gbs = 0.001;
    for (int w = 0; w < kWorkers; ++w) {
      cluster.worker_node[w] = w < 2 ? "node-a" : "node-b";
      cluster.worker_flags[w] = flags;
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
  // Steps [first, last] as a training loop does (three calls at most
  // each), none resetting momentum, then the replay: bit for bit.
  void StepOnAsTheReplay(int64_t first, int64_t last) {
    const std::vector<LoopOutcome> loops = RunTrainerLoops(first, last, 3);
    for (int r = 0; r < trainers(); ++r) {
      ASSERT_TRUE(loops[r].finished)
          << "trainer " << r << ": "
          << loops[r].attempts.back().result.status();
      for (const StepOutcome& o : loops[r].attempts) {
        if (o.result.ok()) {
          EXPECT_EQ(o.result->momentum_reset, 0);
        }
      }
    }
    for (int64_t step = first; step <= last; ++step) {
      ASSERT_TRUE(reference_->Step(step).ok());
    }
    ExpectMatchesReference(*reference_, kExact);
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
  // One group per node, in the order the plan's ranks meet the nodes.
  std::set<std::set<int>> nodes;
  for (const std::vector<int>& g : groups) nodes.insert({g.begin(), g.end()});
  EXPECT_EQ(nodes, (std::set<std::set<int>>{{0, 1}, {2, 3}}));
  // Owners and batches name the first group's workers (the other group's
  // run copies of them).
  const std::set<int> first(groups[0].begin(), groups[0].end());
  for (const v1::MatrixPlacement& m : plan().matrices()) {
    for (const std::string& owner : m.owners()) {
      EXPECT_EQ(first.count(WorkerIndex(owner)), 1u) << m.name();
    }
  }
  std::set<int> batched;
  for (const v1::Batch& b : plan().batches()) {
    batched.insert(WorkerIndex(b.worker_id()));
  }
  EXPECT_EQ(batched, first);
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
  ASSERT_NO_FATAL_FAILURE(StepOnAsTheReplay(4, 8));
  // The restarted process got what it owns by the handover.
  const std::string log = WorkerLog(1);
  EXPECT_TRUE(absl::StrContains(log, "momentum handover: sent 0, received"))
      << log;
  EXPECT_FALSE(absl::StrContains(log, "lost their previous owner")) << log;
}

// A worker killed with part of a step in its trainer's parameters: updates
// applied as they landed, before the votes, and the plan's rank 0 killed
// once every vote was in, nothing decided (every worker stops there once).
// Nobody commits the step; the live workers go on and put their trainers'
// parameters back. The restarted worker's trainer holds part of a step
// nobody committed: its parameters of the step before come whole from a
// peer's trainer (a repair round), its momentum from the other node's
// owners, and training goes on exactly, with nothing reset and nothing to
// reload.
TEST_F(OwnerGroupsProcessTest, PartOfAStepNobodyCommittedIsRepairedFromAPeer) {
  ASSERT_NO_FATAL_FAILURE(StartAndStep(
      3, "", {"--apply_early=always", "--test_pause_at=prepared@4"}));
  ASSERT_EQ(Groups().size(), 2u) << plan().DebugString();
  const int killed = WorkerAtPlanRank(0);
  std::vector<std::optional<StepOutcome>> stepped;
  std::thread stepping([&] { stepped = RunStep(4); });
  absl::Status stopped = absl::OkStatus();
  for (int w = 0; w < kWorkers && stopped.ok(); ++w) {
    stopped = WaitUntilStopped(w, absl::Seconds(30));
  }
  ASSERT_NO_FATAL_FAILURE(KillWorker(killed));
  for (int w = 0; w < kWorkers; ++w) {
    if (w != killed) SignalWorker(w, SIGCONT);
  }
  stepping.join();
  ASSERT_TRUE(stopped.ok()) << stopped;
  for (const auto& o : stepped) {
    ASSERT_TRUE(o.has_value());
    EXPECT_FALSE(o->result.ok());
  }
  ASSERT_NO_FATAL_FAILURE(RestartWorker(killed));
  const absl::Status planned = WaitForFullPlan(absl::Seconds(20));
  ASSERT_TRUE(planned.ok()) << planned;
  ASSERT_NO_FATAL_FAILURE(StepOnAsTheReplay(4, 8));
  const std::string log = WorkerLog(killed);
  EXPECT_TRUE(absl::StrContains(log, "and part of step 4")) << log;
  EXPECT_TRUE(absl::StrContains(log,
                                "did not hold the step whole; repaired "
                                "from rank"))
      << log;
  EXPECT_TRUE(absl::StrContains(log, "momentum handover: sent 0, received"))
      << log;
}

// Every copy of some matrices lost at once: both workers at one position
// (one on each node) killed after step 3's checkpoint. Their restarted
// processes restore those matrices from the job's checkpoint of step 3,
// and training goes on exactly.
TEST_F(OwnerGroupsProcessTest, EveryCopyLostIsRestoredFromTheCheckpoint) {
  const std::string dir = testing::NewTempDir("owner-groups");
  ASSERT_NO_FATAL_FAILURE(StartAndStep(3, dir + "/ckpt"));
  const std::vector<std::vector<int>> groups = Groups();
  ASSERT_EQ(groups.size(), 2u) << plan().DebugString();
  const int first = groups[0][1], second = groups[1][1];
  for (const int w : {first, second}) {
    ASSERT_NO_FATAL_FAILURE(WaitForCheckpointStatus(w, 3, /*restored=*/false));
  }
  for (const int w : {first, second}) ASSERT_NO_FATAL_FAILURE(KillWorker(w));
  for (const int w : {first, second}) ASSERT_NO_FATAL_FAILURE(RestartWorker(w));
  const absl::Status planned = WaitForFullPlan(absl::Seconds(20));
  ASSERT_TRUE(planned.ok()) << planned;
  ASSERT_NO_FATAL_FAILURE(StepOnAsTheReplay(4, 8));
}

// A rolling restart (SIGTERM, one worker at a time) of a grouped job while
// the trainers step as a user's loop does: each drain plans without groups
// (a rank that owns nothing), the restart plans them again, and every
// change hands the momentum over: to owners with no copy from a holder of
// their group, or from one still owning it in another group. Strict, no
// checkpoints: nothing is reset, and the run ends bit-identical.
TEST_F(OwnerGroupsProcessTest, ARollingRestartOfAGroupedJobLosesNothing) {
  constexpr int64_t kSteps = 120;
  ASSERT_NO_FATAL_FAILURE(StartAndStep(0));
  ASSERT_EQ(Groups().size(), 2u) << plan().DebugString();
  LoopProgress done(trainers());
  std::vector<RetryingLoop> loops;
  std::thread trainers_thread(
      [&] { loops = RunRetryingLoops(1, kSteps, &done); });
  int restarted = 0;
  for (int w = 0; w < kWorkers; ++w) {
    if (!done.WaitFor(15 + 25 * w, absl::Seconds(120))) break;
    SignalWorker(w, SIGTERM);
    const absl::StatusOr<int> exited = WaitForWorkerExit(w, absl::Seconds(30));
    ASSERT_TRUE(exited.ok())
        << "worker " << w << ": " << exited.status() << "\n"
        << WorkerLog(w);
    EXPECT_TRUE(absl::StrContains(WorkerLog(w), "drained: step"))
        << WorkerLog(w);
    ASSERT_NO_FATAL_FAILURE(RestartWorker(w));
    ++restarted;
  }
  trainers_thread.join();
  ASSERT_EQ(restarted, kWorkers) << "stalled at step " << done.Slowest();
  int64_t resets = 0;
  for (int r = 0; r < trainers(); ++r) {
    EXPECT_TRUE(loops[r].finished)
        << "trainer " << r << " stopped after step " << loops[r].last_done
        << ": " << loops[r].last_failure;
    resets += loops[r].resets;
  }
  EXPECT_EQ(resets, 0);
  for (int64_t step = 1; step <= kSteps; ++step) {
    ASSERT_TRUE(reference_->Step(step).ok());
  }
  const absl::Status planned = WaitForFullPlan(absl::Seconds(20));
  ASSERT_TRUE(planned.ok()) << planned;
  EXPECT_EQ(Groups().size(), 2u) << plan().DebugString();
  ExpectMatchesReference(*reference_, kExact);
}

// HSDP: four trainers in two replica groups of two (JobSpec.replicas),
// each holding its shard of every row-sharded matrix (rank % 2 of 2), the
// groups holding the same gradients. The coordinator plans one owner group
// per replica group once the workers' heartbeats name their trainers; each
// owner gathers its group's two shards, and the run matches the replay.
TEST_F(OwnerGroupsProcessTest, HsdpReplicaGroupsTrainAsTheReplay) {
  const ModelDecl model = SmallModel(scheduler::Layout::kRowSharded);
  ClusterOptions cluster = {.workers = kWorkers,
                            .io_timeout_ms = 5000,
                            .lease_ttl_ms = 1500,
                            .heartbeat_interval_ms = 200};
  cluster.replicas = 2;
  ASSERT_NO_FATAL_FAILURE(StartJob(model, cluster));
  ReferenceModel reference(model, kWorkers, PlannedAlgorithms());
  // The trainers' Start returned once their workers followed a plan of the
  // replica groups (an attach waits for it): no step is refused.
  for (int64_t step = 1; step <= 8; ++step) {
    for (const auto& o : RunStep(step)) {
      ASSERT_TRUE(o.has_value() && o->result.ok())
          << "step " << step << ": " << o->result.status();
      EXPECT_EQ(o->result->momentum_reset, 0);
    }
  }
  for (int64_t step = 1; step <= 8; ++step) {
    ASSERT_TRUE(reference.Step(step).ok());
  }
  // plan() becomes the grouped plan every worker follows (the momentum is
  // read from its owners).
  const absl::Status planned = WaitForFullPlan(absl::Seconds(20));
  ASSERT_TRUE(planned.ok()) << planned;
  const std::vector<std::vector<int>> groups = Groups();
  ASSERT_EQ(groups.size(), 2u) << plan().DebugString();
  // Replica group g is trainers 2g and 2g + 1, whose workers are w2g and
  // w2g+1 here.
  std::set<std::set<int>> replicas;
  for (const std::vector<int>& g : groups) {
    replicas.insert({g.begin(), g.end()});
  }
  EXPECT_EQ(replicas, (std::set<std::set<int>>{{0, 1}, {2, 3}}));
  ExpectMatchesReference(reference, kExact);
}

}  // namespace
}  // namespace muonps
