// The exchange nodes across nodes with real processes (a coordinator, CPU
// workers over TCP, the trainers' clients): workers that say they run on
// several nodes of as many each get a plan with exchange nodes where the
// coordinator weighs the network as slow. Unreduced gradients (where a ring
// over every rank per matrix costs more than the exchange's few launches)
// are summed within each node, then across the nodes, each matrix's sum
// gathered to its owner, and the updates gathered back; row_sharded rows
// (where the owners' own ports are the bottleneck) cross the network to a
// relay on the owner's node, which passes them on. Training matches the
// single-process replay bit for bit, and a killed worker's restart from
// the checkpoint trains on exactly.
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "tests/data_plane_fixture.h"
#include "tests/harness/child_process.h"

namespace muonps {
namespace {

using testing::ClusterOptions;
using testing::DataPlaneFixture;
using testing::ModelDecl;
using testing::ReferenceModel;

constexpr int kWorkers = 6;
constexpr double kExact = 0;

class NodeExchangeProcessTest : public DataPlaneFixture {
 protected:
  // Worker w on node `node_of[w]`, 1 ms a network hop; `steps` steps.
  // `network_gbs` > 0: the coordinator's weighing of the network's links.
  void StartAndStep(const ModelDecl& model, const std::vector<int>& node_of,
                    int64_t steps, const std::string& checkpoint_dir = "",
                    double network_gbs = 0) {
    ClusterOptions cluster = {.workers = kWorkers,
                              .io_timeout_ms = 5000,
                              .lease_ttl_ms = 1500,
                              .heartbeat_interval_ms = 200};
    cluster.network_hop_us = 1000;
    cluster.network_gbs = network_gbs;
    cluster.checkpoint_dir = checkpoint_dir;
    cluster.checkpoint_every = checkpoint_dir.empty() ? 0 : 1;
    for (int w = 0; w < kWorkers; ++w) {
      cluster.worker_node[w] = absl::StrCat("node-", node_of[w]);
    }
    ASSERT_NO_FATAL_FAILURE(StartJob(model, cluster));
    reference_.emplace(model, kWorkers, PlannedAlgorithms());
    ASSERT_NO_FATAL_FAILURE(ExpectExchangeNodes(node_of));
    ASSERT_NO_FATAL_FAILURE(Step(1, steps));
  }
  // The plan sums over the nodes of `node_of` (each node's workers, by
  // position); the replay adds as it does.
  void ExpectExchangeNodes(const std::vector<int>& node_of) {
    ASSERT_GT(plan().exchange_nodes_size(), 0) << plan().DebugString();
    std::vector<std::vector<int>> nodes;
    for (const v1::NodeWorkers& node : plan().exchange_nodes()) {
      std::vector<int>& workers = nodes.emplace_back();
      for (const std::string& id : node.workers()) {
        workers.push_back(WorkerIndex(id));
      }
      for (const int w : workers) {
        EXPECT_EQ(node_of[w], node_of[workers[0]]) << plan().DebugString();
      }
      EXPECT_EQ(workers.size(), nodes[0].size());
    }
    std::map<int, int> count;
    for (const int n : node_of) ++count[n];
    EXPECT_EQ(nodes.size(), count.size());
    // Trainer r steps with worker r.
    reference_->SumOverNodes(nodes);
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

  // Two nodes of three, `layout` with `network_gbs` (StartAndStep): a
  // worker killed after step 3's checkpoint restarts, its process restores
  // what it owns from the checkpoint, the plan takes the same exchange
  // nodes again, and training goes on exactly.
  void KillRestoreAndTrainOn(scheduler::Layout layout, double network_gbs = 0) {
    const std::string dir = testing::NewTempDir("node-exchange");
    const std::vector<int> node_of = {0, 0, 0, 1, 1, 1};
    const ModelDecl model = testing::SmallModel(layout);
    ASSERT_NO_FATAL_FAILURE(
        StartAndStep(model, node_of, 3, dir + "/ckpt", network_gbs));
    ASSERT_NO_FATAL_FAILURE(WaitForCheckpointStatus(4, 3, /*restored=*/false));
    ASSERT_NO_FATAL_FAILURE(KillWorker(4));
    ASSERT_NO_FATAL_FAILURE(RestartWorker(4));
    const absl::Status planned = WaitForFullPlan(absl::Seconds(20));
    ASSERT_TRUE(planned.ok()) << planned;
    ASSERT_NO_FATAL_FAILURE(ExpectExchangeNodes(node_of));
    const std::vector<testing::LoopOutcome> loops = RunTrainerLoops(4, 8, 3);
    for (int r = 0; r < trainers(); ++r) {
      ASSERT_TRUE(loops[r].finished)
          << "trainer " << r << ": "
          << loops[r].attempts.back().result.status();
    }
    for (int64_t step = 4; step <= 8; ++step) {
      ASSERT_TRUE(reference_->Step(step).ok());
    }
    ExpectMatchesReference(*reference_, kExact);
  }

  std::optional<ReferenceModel> reference_;
};

// Two nodes of three: three positions within each node, three rails of two
// across them.
TEST_F(NodeExchangeProcessTest, TwoNodesOfThreeTrainAsTheReplay) {
  const ModelDecl model = testing::SmallModel(scheduler::Layout::kUnreduced);
  ASSERT_NO_FATAL_FAILURE(StartAndStep(model, {0, 0, 0, 1, 1, 1}, 10));
  EXPECT_EQ(plan().nodes(), 2);
  ExpectMatchesReference(*reference_, kExact);
}

// Three nodes of two, their workers not in rank order: two rails of three,
// each adding the nodes' sums in node order, not rank order. (A job with
// replicated matrices too pays their broadcasts' rings in the same phases, and
// the coordinator keeps the rings for it here; step_atomicity_test runs the
// exchange beside every layout.)
TEST_F(NodeExchangeProcessTest, ThreeNodesOutOfRankOrderTrainAsTheReplay) {
  const ModelDecl model = testing::SmallModel(scheduler::Layout::kUnreduced);
  ASSERT_NO_FATAL_FAILURE(StartAndStep(model, {0, 1, 2, 0, 1, 2}, 8));
  EXPECT_EQ(plan().nodes(), 3);
  ExpectMatchesReference(*reference_, kExact);
}

// Row_sharded gradients on two nodes of three, on a network so slow that
// every owner's own port would carry most of its matrix: the rows from the
// other node go through the relays at their positions on the owner's node,
// and the updates' rows back; the same bits as the replay.
TEST_F(NodeExchangeProcessTest, RowsRelayedAcrossTwoNodesTrainAsTheReplay) {
  const ModelDecl model = testing::SmallModel(scheduler::Layout::kRowSharded);
  ASSERT_NO_FATAL_FAILURE(StartAndStep(model, {0, 0, 0, 1, 1, 1}, 8,
                                       /*checkpoint_dir=*/"",
                                       /*network_gbs=*/0.001));
  EXPECT_EQ(plan().nodes(), 2);
  ExpectMatchesReference(*reference_, kExact);
}

// HSDP: eight trainers in two replica groups of four (JobSpec.replicas),
// each group on two nodes of two, on a network so slow that the owners'
// own ports would carry most of their group's rows: each group's owners
// take the rows from its other node through the relays of their own node,
// within the group, and train as the replay does.
TEST_F(NodeExchangeProcessTest, HsdpReplicaGroupsRelayWithinThemselves) {
  const ModelDecl model = testing::SmallModel(scheduler::Layout::kRowSharded);
  constexpr int kEight = 8;
  ClusterOptions cluster = {.workers = kEight,
                            .io_timeout_ms = 5000,
                            .lease_ttl_ms = 1500,
                            .heartbeat_interval_ms = 200};
  cluster.replicas = 2;
  cluster.network_gbs = 0.001;
  for (int w = 0; w < kEight; ++w) {
    cluster.worker_node[w] = absl::StrCat("node-", w / 2);
  }
  ASSERT_NO_FATAL_FAILURE(StartJob(model, cluster));
  testing::ReferenceModel reference(model, kEight, PlannedAlgorithms());
  for (int64_t step = 1; step <= 6; ++step) {
    for (const auto& o : RunStep(step)) {
      ASSERT_TRUE(o.has_value() && o->result.ok())
          << "step " << step << ": " << o->result.status();
    }
    ASSERT_TRUE(reference.Step(step).ok());
  }
  const absl::Status planned = WaitForFullPlan(absl::Seconds(20));
  ASSERT_TRUE(planned.ok()) << planned;
  EXPECT_EQ(plan().owner_groups_size(), 2) << plan().DebugString();
  EXPECT_EQ(plan().exchange_nodes_size(), 4) << plan().DebugString();
  ExpectMatchesReference(reference, kExact);
}

// A worker killed after step 3's checkpoint: its restarted process
// restores what it owns from the checkpoint, the plan sums over the same
// nodes again, and training goes on exactly.
TEST_F(NodeExchangeProcessTest, AKilledWorkerRestoresAndTrainsOnAsTheReplay) {
  ASSERT_NO_FATAL_FAILURE(KillRestoreAndTrainOn(scheduler::Layout::kUnreduced));
}

// The same with row_sharded rows relayed (the killed worker a relay or an
// owner of rows from the other node).
TEST_F(NodeExchangeProcessTest, AKilledRelayRestoresAndTrainsOnAsTheReplay) {
  ASSERT_NO_FATAL_FAILURE(
      KillRestoreAndTrainOn(scheduler::Layout::kRowSharded, 0.001));
}

}  // namespace
}  // namespace muonps
