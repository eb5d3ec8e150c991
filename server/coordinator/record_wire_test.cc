// The coordinator's records through the edge (record_wire.h): a job spec
// comes back byte for byte (unset fields stay unset), values outside the
// enums are refused naming the field, a published plan (its owner groups
// too) reads back as it was written, and a worker's step stats keep every
// figure.
#include "server/coordinator/record_wire.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace muonps {
namespace coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::JobSpec DeclaredSpec() {
  v1::JobSpec spec;
  spec.set_name("run");
  v1::Matrix* bare = spec.add_matrices();  // every default left unset
  bare->set_name("a");
  bare->set_rows(64);
  bare->set_cols(128);
  v1::Matrix* full = spec.add_matrices();
  full->set_name("moe");
  full->set_rows(32);
  full->set_cols(64);
  full->set_experts(4);
  full->set_dtype(v1::DTYPE_BF16);
  full->set_layout(v1::LAYOUT_UNREDUCED);
  full->set_layer(1);
  v1::Matrix* explicit_defaults = spec.add_matrices();
  explicit_defaults->set_name("b");
  explicit_defaults->set_rows(8);
  explicit_defaults->set_cols(8);
  explicit_defaults->set_experts(1);
  explicit_defaults->set_dtype(v1::DTYPE_FP32);
  explicit_defaults->set_layout(v1::LAYOUT_REPLICATED);
  spec.mutable_muon()->set_lr(0.02);
  spec.mutable_muon()->set_momentum(0);  // set, though zero
  spec.mutable_muon()->set_ns_algorithm(v1::NS_ALGORITHM_GRAM);
  spec.mutable_muon()->set_polar_express(true);
  spec.mutable_adamw()->set_beta2(0.999);
  spec.set_bucket_bytes(int64_t{8} << 20);
  spec.set_checkpoint_dir("/ckpt");
  spec.set_checkpoint_every(100);
  return spec;
}

TEST(RecordWireTest, AJobSpecComesBackByteForByte) {
  const v1::JobSpec declared = DeclaredSpec();
  absl::StatusOr<JobSpec> spec = JobSpecFromProto(declared);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(JobSpecToProto(*spec).SerializeAsString(),
            declared.SerializeAsString());
  // The planner reads the matrices with their defaults filled in.
  EXPECT_EQ(spec->matrices[0].experts, 1);
  EXPECT_EQ(spec->matrices[0].dtype, DType::kFloat32);
  EXPECT_EQ(spec->matrices[1].layout, scheduler::Layout::kUnreduced);
  ASSERT_TRUE(spec->muon.momentum.has_value());
  EXPECT_EQ(*spec->muon.momentum, 0);
  EXPECT_FALSE(spec->muon.nesterov.has_value());
  EXPECT_EQ(spec->muon.ns_algorithm, scheduler::AlgorithmPolicy::kGram);
  // A spec with no hyperparameters at all stays without them.
  v1::JobSpec bare;
  bare.set_name("bare");
  *bare.add_matrices() = declared.matrices(0);
  EXPECT_EQ(JobSpecToProto(*JobSpecFromProto(bare)).SerializeAsString(),
            bare.SerializeAsString());
}

TEST(RecordWireTest, ValuesOutsideTheEnumsAreRefusedNamingTheirField) {
  v1::JobSpec spec = DeclaredSpec();
  spec.mutable_matrices(1)->set_dtype(static_cast<v1::DType>(99));
  EXPECT_THAT(std::string(JobSpecFromProto(spec).status().message()),
              HasSubstr("job.matrices[1].dtype"));
  spec = DeclaredSpec();
  spec.mutable_matrices(2)->set_layout(static_cast<v1::Layout>(42));
  EXPECT_THAT(std::string(JobSpecFromProto(spec).status().message()),
              HasSubstr("job.matrices[2].layout"));
  spec = DeclaredSpec();
  spec.mutable_muon()->set_adjust_lr_fn(static_cast<v1::LrAdjustment>(7));
  EXPECT_THAT(std::string(JobSpecFromProto(spec).status().message()),
              HasSubstr("job.muon.adjust_lr_fn"));
  spec = DeclaredSpec();
  spec.mutable_muon()->set_ns_algorithm(static_cast<v1::NsAlgorithm>(9));
  const absl::Status status = JobSpecFromProto(spec).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("job.muon.ns_algorithm"));
}

// "a" on w0 and the four experts of "moe" split over both workers.
std::shared_ptr<const PublishedPlan> TwoWorkerPlan(
    const std::shared_ptr<const std::vector<scheduler::MatrixSpec>>& matrices) {
  auto plan = std::make_shared<PublishedPlan>();
  plan->job = "run";
  plan->version = 7;
  plan->reason = "worker w1 joined";
  plan->plan_ms = 12.5;
  plan->matrices = matrices;
  scheduler::OwnershipPlan& o = plan->ownership;
  o.matrix_names = {"a", "moe", "b"};
  o.worker_ids = {"w0", "w1"};
  o.dedicated = 1;
  o.owners = {{0}, {0, 1, 1, 0}, {1}};
  scheduler::Batch batch;
  batch.worker = 1;
  batch.rows = 32;
  batch.cols = 64;
  batch.items = {{1, 1}, {1, 2}};
  batch.parts = {{2, NsAlgorithm::kGram, 0.002}};
  batch.seconds = 0.002;
  o.batches = {batch};
  o.worker_seconds = {0.004, 0.003};
  o.worker_memory_bytes = {1 << 20, 1 << 19};
  o.worker_momentum_bytes = {1 << 18, 1 << 17};
  o.worker_link_bytes = {4096, 2048};
  o.max_seconds = 0.004;
  o.mean_seconds = 0.0035;
  o.imbalance = 0.004 / 0.0035;
  o.lower_bound = 0.003;
  o.moved_bytes = 8192;
  plan->buckets = {{{2, 1}, 1, 1, 4096}, {{0}, 0, 0, 1024}};
  return plan;
}

TEST(RecordWireTest, APublishedPlanReadsBackAsItWasWritten) {
  absl::StatusOr<JobSpec> spec = JobSpecFromProto(DeclaredSpec());
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto matrices = std::make_shared<const std::vector<scheduler::MatrixSpec>>(
      spec->matrices);
  const v1::Plan written = PlanToProto(*TwoWorkerPlan(matrices));
  EXPECT_EQ(written.name(), "jobs/run/plans/7");
  EXPECT_EQ(written.matrices(1).bucket(), 0);
  absl::StatusOr<std::shared_ptr<const PublishedPlan>> read =
      PlanFromProto(written, matrices);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(PlanToProto(**read).SerializeAsString(),
            written.SerializeAsString());
  EXPECT_EQ((*read)->ownership.worker_link_bytes[1], 2048);
  EXPECT_EQ((*read)->buckets[0].matrices, (std::vector<int32_t>{2, 1}));
}

TEST(RecordWireTest, OwnerGroupsReadBackAsTheyWereWritten) {
  absl::StatusOr<JobSpec> spec = JobSpecFromProto(DeclaredSpec());
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto matrices = std::make_shared<const std::vector<scheduler::MatrixSpec>>(
      spec->matrices);
  auto plan = std::make_shared<PublishedPlan>(*TwoWorkerPlan(matrices));
  plan->ownership.dedicated = 0;
  plan->ownership.owners = {{0}, {0, 0, 0, 0}, {0}};
  plan->ownership.groups = {{0}, {1}};
  const v1::Plan written = PlanToProto(*plan);
  ASSERT_EQ(written.owner_groups_size(), 2);
  EXPECT_THAT(written.owner_groups(0).workers(), ElementsAre("w0"));
  EXPECT_THAT(written.owner_groups(1).workers(), ElementsAre("w1"));
  absl::StatusOr<std::shared_ptr<const PublishedPlan>> read =
      PlanFromProto(written, matrices);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ((*read)->ownership.groups, plan->ownership.groups);
  EXPECT_EQ(PlanToProto(**read).SerializeAsString(),
            written.SerializeAsString());
}

TEST(RecordWireTest, TheTrainerShardsAPlanAssumedReadBack) {
  absl::StatusOr<JobSpec> spec = JobSpecFromProto(DeclaredSpec());
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto matrices = std::make_shared<const std::vector<scheduler::MatrixSpec>>(
      spec->matrices);
  auto plan = std::make_shared<PublishedPlan>(*TwoWorkerPlan(matrices));
  plan->trainer_shards = {.shards = 2, .shard_of = {1, -1}};
  const v1::Plan written = PlanToProto(*plan);
  EXPECT_EQ(written.trainer_shards(), 2);
  EXPECT_EQ(written.loads(0).trainer_shard(), 1);
  EXPECT_EQ(written.loads(1).trainer_shard(), -1);
  absl::StatusOr<std::shared_ptr<const PublishedPlan>> read =
      PlanFromProto(written, matrices);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ((*read)->trainer_shards.shards, 2);
  EXPECT_EQ((*read)->trainer_shards.shard_of, (std::vector<int32_t>{1, -1}));
  // None assumed: none read back.
  read = PlanFromProto(PlanToProto(*TwoWorkerPlan(matrices)), matrices);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_FALSE((*read)->trainer_shards.known());
  v1::Plan bad = written;
  bad.mutable_loads(1)->set_trainer_shard(2);
  EXPECT_THAT(std::string(PlanFromProto(bad, matrices).status().message()),
              HasSubstr("plan.loads[1].trainer_shard"));
  bad = written;
  bad.set_trainer_shards(-2);
  EXPECT_THAT(std::string(PlanFromProto(bad, matrices).status().message()),
              HasSubstr("plan.trainer_shards"));
}

TEST(RecordWireTest, APlanOfAnotherJobIsRefusedNamingTheField) {
  absl::StatusOr<JobSpec> spec = JobSpecFromProto(DeclaredSpec());
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto matrices = std::make_shared<const std::vector<scheduler::MatrixSpec>>(
      spec->matrices);
  v1::Plan plan = PlanToProto(*TwoWorkerPlan(matrices));
  plan.mutable_loads(1)->set_worker_id("w9");
  EXPECT_THAT(std::string(PlanFromProto(plan, matrices).status().message()),
              HasSubstr("plan.loads[1].worker_id"));
  plan = PlanToProto(*TwoWorkerPlan(matrices));
  plan.mutable_buckets(0)->set_matrices(0, "nope");
  EXPECT_THAT(std::string(PlanFromProto(plan, matrices).status().message()),
              HasSubstr("plan.buckets[0].matrices[0]"));
}

TEST(RecordWireTest, StepStatsKeepEveryFigure) {
  StepStats stats;
  stats.step = 12;
  stats.plan_version = 3;
  stats.step_seconds = 0.075;
  stats.ns_seconds = 0.041;
  stats.predicted_ns_seconds = 0.0375;
  stats.bytes_moved = int64_t{7} << 30;
  const v1::WorkerStepStats proto = StepStatsToProto(stats);
  EXPECT_EQ(proto.step(), 12);
  EXPECT_EQ(proto.plan_version(), 3);
  EXPECT_EQ(proto.step_seconds(), 0.075);
  EXPECT_EQ(proto.ns_seconds(), 0.041);
  EXPECT_EQ(proto.predicted_ns_seconds(), 0.0375);
  EXPECT_EQ(proto.bytes_moved(), int64_t{7} << 30);
  // Every field of WorkerStepStats is set (a new one added to the message
  // without a line in StepStatsToProto fails here).
  EXPECT_EQ(proto.GetDescriptor()->field_count(), 6);
}

}  // namespace
}  // namespace coordinator
}  // namespace muonps
