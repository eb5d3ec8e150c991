#include "server/worker/wire.h"

#include <cstdint>
#include <string>

#include "gtest/gtest.h"

namespace muonps {
namespace worker {
namespace {

v1::AttachRequest OneTensor() {
  v1::AttachRequest request;
  request.set_trainer_rank(1);
  request.set_trainer_count(2);
  request.set_device("cuda:0");
  request.mutable_done_counter()->set_ipc_handle("handle");
  request.mutable_done_counter()->set_offset(64);
  v1::TensorBinding* t = request.add_tensors();
  t->set_name("layers.0.w");
  t->set_muon(true);
  t->set_elements(12);
  t->set_dtype(v1::DTYPE_BF16);
  t->set_group(3);
  t->mutable_grad_cuda()->set_offset(128);
  t->set_grad_ready_event("event");
  return request;
}

TEST(WireTest, AttachRequestBecomesTheDomainStructWithGroupIndices) {
  v1::AttachRequest request = OneTensor();
  v1::TensorBinding* none = request.add_tensors();
  none->set_name("bias");
  none->set_layout(v1::LAYOUT_UNREDUCED);
  const absl::StatusOr<AttachRequest> got = AttachRequestFromProto(request);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->trainer_rank, 1);
  EXPECT_EQ(got->trainer_count, 2);
  EXPECT_EQ(got->device, "cuda:0");
  EXPECT_EQ(got->done_counter.ipc_handle, "handle");
  EXPECT_EQ(got->done_counter.offset, 64);
  ASSERT_EQ(got->tensors.size(), 2u);
  EXPECT_EQ(got->tensors[0].dtype, DType::kBFloat16);
  EXPECT_EQ(got->tensors[0].group, 2);  // 1 + index on the wire
  EXPECT_EQ(got->tensors[0].grad_cuda.offset, 128);
  EXPECT_EQ(got->tensors[0].grad_ready_event, "event");
  EXPECT_EQ(got->tensors[1].dtype, DType::kFloat32);  // unspecified
  EXPECT_EQ(got->tensors[1].layout, scheduler::Layout::kUnreduced);
  EXPECT_EQ(got->tensors[1].group, -1);
}

TEST(WireTest, ValuesNoDomainTypeHoldsAreRefusedNamingTheField) {
  for (const auto& [field, edit] :
       std::vector<std::pair<std::string, void (*)(v1::TensorBinding*)>>{
           {"tensor \"layers.0.w\".dtype: unknown value 99",
            [](v1::TensorBinding* t) {
              t->set_dtype(static_cast<v1::DType>(99));
            }},
           {"tensor \"layers.0.w\".layout: unknown value 7",
            [](v1::TensorBinding* t) {
              t->set_layout(static_cast<v1::Layout>(7));
            }},
           {"tensor \"layers.0.w\".group: -1 is outside [0, 1024]",
            [](v1::TensorBinding* t) { t->set_group(-1); }},
           {"tensor \"layers.0.w\".group: 1025 is outside [0, 1024]",
            [](v1::TensorBinding* t) { t->set_group(1025); }},
           {"tensor \"layers.0.w\".grad_ready_event: only job matrices lend "
            "one",
            [](v1::TensorBinding* t) { t->set_muon(false); }},
       }) {
    v1::AttachRequest request = OneTensor();
    edit(request.mutable_tensors(0));
    const absl::StatusOr<AttachRequest> got = AttachRequestFromProto(request);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(got.status().message().find(field), std::string::npos)
        << got.status();
  }
}

// A step names no tensor: a hundred groups' values travel in under 4 KiB,
// whatever the number of matrices (they were attached in their groups
// once), and come out by index.
TEST(WireTest, AStepOfAHundredGroupsIsUnderFourKibAndKeepsItsOrder) {
  v1::StepRequest request;
  request.set_step_id(123456789);
  request.set_lr(0.02);
  request.set_weight_decay(0.1);
  request.set_adamw_lr(3e-4);
  for (int g = 0; g < 100; ++g) {
    v1::GroupHyperparameters* values = request.add_groups();
    values->set_lr(0.02 / (g + 1));
    values->set_weight_decay(0.1);
    values->set_adamw_lr(3e-4 / (g + 1));
    values->set_adamw_weight_decay(0.01);
  }
  EXPECT_LT(request.ByteSizeLong(), 4096u);
  const StepRequest got = StepRequestFromProto(request);
  ASSERT_EQ(got.groups.size(), 100u);
  EXPECT_EQ(got.step_id, 123456789);
  EXPECT_EQ(got.groups[41].lr, 0.02 / 42);
  EXPECT_EQ(got.groups[41].adamw_lr, 3e-4 / 42);
  EXPECT_EQ(got.groups[99].adamw_weight_decay, 0.01);
}

TEST(WireTest, AStepsGradientPlacesComeOutByPosition) {
  v1::StepRequest request;
  request.set_step_id(3);
  for (int position : {4, 0}) {
    v1::GradientPlace* place = request.add_gradients();
    place->set_matrix(position);
    place->mutable_buffer()->set_ipc_handle(std::string(64, 'a' + position));
    place->mutable_buffer()->set_offset(512 * position);
  }
  const StepRequest got = StepRequestFromProto(request);
  ASSERT_EQ(got.gradients.size(), 2u);
  EXPECT_EQ(got.gradients[0].matrix, 4);
  EXPECT_EQ(got.gradients[0].buffer.ipc_handle, std::string(64, 'e'));
  EXPECT_EQ(got.gradients[0].buffer.offset, 2048);
  EXPECT_EQ(got.gradients[1].matrix, 0);
  EXPECT_EQ(got.gradients[1].buffer.offset, 0);
  EXPECT_TRUE(StepRequestFromProto(v1::StepRequest()).gradients.empty());
}

TEST(WireTest, StepResponseRoundTrips) {
  StepResponse response;
  response.step_id = 7;
  response.already_applied = true;
  response.seconds = 0.5;
  response.ns_seconds = 0.25;
  response.predicted_ns_seconds = 0.2;
  response.bytes_moved = 1 << 20;
  response.momentum_reset = 2;
  response.plan_version = 3;
  response.last_step = 9;
  const v1::StepResponse out = StepResponseToProto(response);
  EXPECT_EQ(out.last_step(), 9);
  EXPECT_EQ(out.step_id(), 7);
  EXPECT_TRUE(out.already_applied());
  EXPECT_EQ(out.seconds(), 0.5);
  EXPECT_EQ(out.ns_seconds(), 0.25);
  EXPECT_EQ(out.predicted_ns_seconds(), 0.2);
  EXPECT_EQ(out.bytes_moved(), 1 << 20);
  EXPECT_EQ(out.momentum_reset(), 2);
  EXPECT_EQ(out.plan_version(), 3);
}

// A one-matrix job and its one-worker plan; buckets cut at `plan_bound`
// (0: a plan from before Plan.bucket_bytes) for a job asking `job_bound`.
absl::StatusOr<JobPlan> BucketBound(int64_t job_bound, int64_t plan_bound) {
  v1::JobSpec job;
  job.set_name("x");
  v1::Matrix* m = job.add_matrices();
  m->set_name("w");
  m->set_rows(4);
  m->set_cols(8);
  job.set_bucket_bytes(job_bound);
  v1::Plan plan;
  plan.set_version(1);
  plan.add_workers("a");
  v1::MatrixPlacement* placement = plan.add_matrices();
  placement->set_name("w");
  placement->set_rows(4);
  placement->set_cols(8);
  placement->add_owners("a");
  plan.set_bucket_bytes(plan_bound);
  plan.set_apply_at_commit(plan_bound == job_bound);
  return JobPlanFromProto(job, plan);
}

TEST(WireTest, TheStepScheduleCutsBucketsWhereThePlanSays) {
  EXPECT_EQ(BucketBound(0, 256 << 20)->job.bucket_bytes, 256 << 20);
  EXPECT_EQ(BucketBound(8 << 20, 8 << 20)->job.bucket_bytes, 8 << 20);
  // A coordinator from before Plan.bucket_bytes: the job's, or 64 MiB.
  EXPECT_EQ(BucketBound(8 << 20, 0)->job.bucket_bytes, 8 << 20);
  EXPECT_EQ(BucketBound(0, 0)->job.bucket_bytes, 64 << 20);
}

TEST(WireTest, ThePlanSaysWhetherUpdatesWaitForTheCommit) {
  EXPECT_TRUE(BucketBound(8 << 20, 8 << 20)->job.apply_at_commit);
  EXPECT_FALSE(BucketBound(0, 256 << 20)->job.apply_at_commit);
}

}  // namespace
}  // namespace worker
}  // namespace muonps
