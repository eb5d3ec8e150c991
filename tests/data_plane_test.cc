// The data plane with real processes on loopback: a muonps-coordinator, 1 to
// 3 muonps-worker daemons and as many trainer ranks (muonps::Client, one
// thread each) stepping a small model of every layout together. Proves that
// after fifty concurrent steps every trainer's parameters (its rows, when
// parameters are sharded) and AdamW tensors, and every owner's momentum as
// GetMomentum reports it, equal a single-process run of the same kernels on
// the mean (unreduced) or full (replicated, row_sharded) gradients within
// 1e-5 relative, whichever worker the plan made the owner, and whether the
// reference runs the Newton-Schulz variant the planner chose or plain NS5.
// A row_sharded stack of experts is split either by each expert's rows or
// by whole experts (FSDP2's Shard(0) of a 3-D parameter).
// Also: workers on two nodes (--node) train the same; hyperparameters that
// Client::Start accepts reach the steps (or are refused), never silently
// replaced.
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "kernels/muon_kernels.h"
#include "tests/data_plane_fixture.h"

namespace muonps {
namespace {

using scheduler::Layout;
using testing::DataPlaneFixture;
using testing::MixedModel;
using testing::ModelDecl;
using testing::ReferenceModel;
using testing::SmallModel;
using testing::StepOutcome;

constexpr int kSteps = 50;
constexpr double kTolerance = 1e-5;

struct LayoutCase {
  std::string name;
  Layout layout = Layout::kReplicated;
  bool shard_params = true;
  bool mixed = false;  // every layout in one job instead of `layout`
  int workers = 1;
  bool shard_experts = false;  // row_sharded stacks split whole experts
};

void PrintTo(const LayoutCase& c, std::ostream* os) { *os << c.name; }

class DataPlaneTest : public DataPlaneFixture,
                      public ::testing::WithParamInterface<LayoutCase> {};

TEST_P(DataPlaneTest, FiftyStepsMatchTheSingleProcessReferenceOnEveryRank) {
  const LayoutCase& c = GetParam();
  const ModelDecl model =
      c.mixed ? MixedModel()
              : SmallModel(c.layout, c.shard_params, c.shard_experts);
  ASSERT_NO_FATAL_FAILURE(StartJob(model, {.workers = c.workers}));
  // The reference runs the Newton-Schulz variant the planner chose for each
  // owner's batch (auto may pick Gram NS for rectangular shapes); Gram NS
  // agrees with NS5 to ~1e-6, so an NS5-only reference must agree too.
  ReferenceModel reference(model, c.workers, PlannedAlgorithms());
  ReferenceModel ns5_reference(model, c.workers, {});
  for (int64_t step = 1; step <= kSteps; ++step) {
    const std::vector<std::optional<StepOutcome>> outcomes = RunStep(step);
    for (int r = 0; r < c.workers; ++r) {
      ASSERT_TRUE(outcomes[r].has_value());
      ASSERT_TRUE(outcomes[r]->result.ok())
          << "step " << step << " trainer " << r << ": "
          << outcomes[r]->result.status();
      EXPECT_FALSE(outcomes[r]->result->already_applied);
      EXPECT_EQ(outcomes[r]->result->plan_version, plan().version());
      EXPECT_EQ(outcomes[r]->result->momentum_reset, 0);
    }
    ASSERT_TRUE(reference.Step(step).ok());
    ASSERT_TRUE(ns5_reference.Step(step).ok());
  }
  ExpectMatchesReference(reference, kTolerance);
  ExpectMatchesReference(ns5_reference, kTolerance);
  if (c.shard_experts && c.workers > 1) {
    // The plan knew which trainer holds each expert, and left some with
    // their holders (those parity covers: nothing moves for them).
    ASSERT_EQ(plan().trainer_shards(), c.workers);
    for (const v1::WorkerLoad& load : plan().loads()) {
      ASSERT_GE(load.trainer_shard(), 0) << load.worker_id();
    }
    EXPECT_GT(ExpertsOwnedByHolders(plan()), 0);
  }
  // Trainers that keep every parameter whole lend their staging, and every
  // worker writes its updates into the others' (shared memory on the CPU);
  // where a trainer keeps only its rows, none lends a window, nothing is
  // exchanged, and the transport carries every update.
  if (c.workers < 2) return;
  const bool whole =
      !c.mixed && !(c.layout == Layout::kRowSharded && c.shard_params);
  const std::string writers =
      absl::StrCat(c.workers, " of ", c.workers,
                   " workers write updates into the trainers' staging");
  for (int w = 0; w < c.workers; ++w) {
    const std::string log = WorkerLog(w);
    if (whole) {
      EXPECT_NE(log.find(writers), std::string::npos)
          << "worker " << w << " did not log \"" << writers << "\"";
    } else {
      EXPECT_EQ(log.find("write updates into"), std::string::npos)
          << "worker " << w;
    }
  }
}

std::vector<LayoutCase> AllCases() {
  std::vector<LayoutCase> cases;
  for (int workers = 1; workers <= 3; ++workers) {
    const std::string n = absl::StrCat("_", workers, "Workers");
    cases.push_back(
        {"Replicated" + n, Layout::kReplicated, true, false, workers});
    cases.push_back(
        {"Unreduced" + n, Layout::kUnreduced, true, false, workers});
    cases.push_back(
        {"RowShardedParams" + n, Layout::kRowSharded, true, false, workers});
    cases.push_back({"RowShardedGradsFullParams" + n, Layout::kRowSharded,
                     false, false, workers});
    // The stack of three experts held whole, as torch.chunk splits them:
    // 2 + 1 on two trainers, 1 + 1 + 1 on three.
    cases.push_back({"RowShardedWholeExperts" + n, Layout::kRowSharded, true,
                     false, workers, true});
  }
  cases.push_back({"RowShardedGradsOfWholeExpertsFullParams_2Workers",
                   Layout::kRowSharded, false, false, 2, true});
  cases.push_back(
      {"EveryLayoutInOneJob_3Workers", Layout::kReplicated, true, true, 3});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Layouts, DataPlaneTest,
                         ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<LayoutCase>& info) {
                           return info.param.name;
                         });

// Workers that say they run on two nodes (--node) and how fast their
// network is (--network_gbs): the coordinator sees the nodes and the links
// (ListWorkers, Plan.nodes, Plan.network_gbs: the least reported), cuts the
// step's buckets at the bound it chose for them (Plan.bucket_bytes, which
// every worker follows), and the steps still match the single-process
// reference.
TEST_F(DataPlaneFixture, WorkersOnTwoNodesTrainAsTheReferenceDoes) {
  const ModelDecl model = SmallModel(Layout::kUnreduced);
  ASSERT_NO_FATAL_FAILURE(StartJob(
      model,
      {.workers = 3,
       .worker_flags = {{0, {"--node=rack1-host1", "--network_gbs=25"}},
                        {1, {"--node=rack1-host1", "--network_gbs=25"}},
                        {2, {"--node=rack1-host2", "--network_gbs=12.5"}}}}));
  EXPECT_EQ(plan().nodes(), 2);
  EXPECT_EQ(plan().network_gbs(), 12.5);
  // Everything fits one 64 MiB bucket: the bound chosen across nodes.
  EXPECT_EQ(plan().bucket_bytes(), int64_t{64} << 20);
  EXPECT_EQ(plan().buckets_size(), 1);
  const absl::StatusOr<v1::ListWorkersResponse> workers = ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  std::map<std::string, std::string> node;
  for (const v1::WorkerInfo& w : workers->workers()) {
    node[w.worker_id()] = w.device().node();
    EXPECT_EQ(w.device().network_gbs(),
              w.device().node() == "rack1-host2" ? 12.5 : 25)
        << w.worker_id();
  }
  ASSERT_EQ(node.size(), 3u);
  EXPECT_EQ(node.begin()->second, "rack1-host1");
  EXPECT_EQ(node.rbegin()->second, "rack1-host2");
  ReferenceModel reference(model, 3, PlannedAlgorithms());
  for (int64_t step = 1; step <= 10; ++step) {
    const std::vector<std::optional<StepOutcome>> outcomes = RunStep(step);
    for (int r = 0; r < 3; ++r) {
      ASSERT_TRUE(outcomes[r].has_value());
      ASSERT_TRUE(outcomes[r]->result.ok())
          << "step " << step << " trainer " << r << ": "
          << outcomes[r]->result.status();
    }
    ASSERT_TRUE(reference.Step(step).ok());
  }
  ExpectMatchesReference(reference, kTolerance);
}

// Hyperparameters that Client::Start accepts (they pass
// ValidateMuonHyperparameters) must reach the workers' steps, or Start must
// refuse them naming the field; a job must never silently run other values.
struct HyperparameterCase {
  std::string name;
  std::string field;  // what a refusal names
  void (*set)(kernels::MuonHyperparameters*);
};

void PrintTo(const HyperparameterCase& c, std::ostream* os) { *os << c.name; }

class JobHyperparameterTest
    : public DataPlaneFixture,
      public ::testing::WithParamInterface<HyperparameterCase> {};

TEST_P(JobHyperparameterTest, AcceptedValueIsHonouredOrRefusedNeverReplaced) {
  const HyperparameterCase& c = GetParam();
  constexpr int kWorkers = 2;
  ModelDecl model = SmallModel(Layout::kUnreduced);
  c.set(&model.muon);
  ASSERT_TRUE(kernels::ValidateMuonHyperparameters(model.muon).ok());
  absl::Status started;
  ASSERT_NO_FATAL_FAILURE(StartJob(model, {.workers = kWorkers}, &started));
  if (!started.ok()) {
    EXPECT_TRUE(absl::StrContains(started.message(), c.field)) << started;
    return;
  }
  ReferenceModel reference(model, kWorkers, PlannedAlgorithms());
  for (int64_t step = 1; step <= 3; ++step) {
    const std::vector<std::optional<StepOutcome>> outcomes = RunStep(step);
    for (int r = 0; r < kWorkers; ++r) {
      ASSERT_TRUE(outcomes[r]->result.ok()) << outcomes[r]->result.status();
    }
    ASSERT_TRUE(reference.Step(step).ok());
  }
  ExpectMatchesReference(reference, kTolerance);
}

INSTANTIATE_TEST_SUITE_P(
    AcceptedByTheClient, JobHyperparameterTest,
    ::testing::Values(
        // torch.optim.Muon with momentum 0 steps along the orthogonalized
        // gradient itself.
        HyperparameterCase{
            "MomentumZero", "momentum",
            [](kernels::MuonHyperparameters* h) { h->momentum = 0; }},
        HyperparameterCase{"PolarExpress", "polar_express",
                           [](kernels::MuonHyperparameters* h) {
                             h->ns.polar_express = true;
                           }}),
    [](const ::testing::TestParamInfo<HyperparameterCase>& info) {
      return info.param.name;
    });

}  // namespace
}  // namespace muonps
