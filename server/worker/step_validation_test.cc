// Validation and agreement of what a trainer sends: every Attach
// field checked before anything is mapped (sizes that no offset overflows
// with, AdamW tensors named once and not as job matrices), AdamW tensors
// agreed among the trainers, param groups naming job matrices once, the
// AdamW lr finite and agreed; each refused on every worker naming the field,
// with nothing changed.
#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "server/worker/step_engine_fixture.h"

namespace muonps {
namespace worker {
namespace {

// Every Attach field is checked before anything is mapped: an AdamW tensor
// of more elements than any offset computed from stays safe with (2^62
// would overflow a byte count), bound twice, named like a job matrix, or
// row-sharded is refused naming the tensor.
TEST_F(StepEngineTest, AttachRefusesAdamWBindingsOutsideTheJobsBounds) {
  ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(PlanWithOwners(1, 0)));
  const std::vector<
      std::pair<std::string, std::function<void(v1::AttachRequest*)>>>
      cases = {
          {"tensor \"bias\".elements",
           [](v1::AttachRequest* r) {
             r->mutable_tensors(0)->set_elements(int64_t{1} << 62);
           }},
          {"tensor \"bias\".param_elements",
           [](v1::AttachRequest* r) {
             r->mutable_tensors(0)->set_param_elements(int64_t{1} << 62);
           }},
          {"tensor \"bias\": is bound twice",
           [](v1::AttachRequest* r) { *r->add_tensors() = r->tensors(0); }},
          {"tensor \"rep.a\": is a matrix of the job",
           [](v1::AttachRequest* r) {
             r->mutable_tensors(0)->set_name("rep.a");
           }},
          {"tensor \"bias\".layout",
           [](v1::AttachRequest* r) {
             r->mutable_tensors(0)->set_layout(v1::LAYOUT_ROW_SHARDED);
           }},
          {"tensor \"bias\".layout: unknown value 99",
           [](v1::AttachRequest* r) {
             r->mutable_tensors(0)->set_layout(static_cast<v1::Layout>(99));
           }},
          {"tensor \"bias\".group: 1025 is outside [0, 1024]",
           [](v1::AttachRequest* r) {
             r->mutable_tensors(0)->set_group(1025);
           }},
          {"trainer_pid", [](v1::AttachRequest* r) { r->set_trainer_pid(-5); }},
      };
  for (const auto& [field, edit] : cases) {
    v1::AttachRequest request = AttachRequestOf(0, 0, /*with_bias=*/true);
    edit(&request);
    const absl::StatusOr<AttachResponse> attached =
        AttachFromProto(*engines_[0], request);
    EXPECT_EQ(attached.status().code(), absl::StatusCode::kInvalidArgument)
        << field;
    EXPECT_NE(attached.status().message().find(field), std::string::npos)
        << attached.status();
  }
}

// Trainers lending different AdamW tensors (a size here) would average
// element ranges that do not match: the step is refused on every worker,
// and nothing changes.
TEST_F(StepEngineTest, TrainersLendingDifferentAdamWTensorsAreRefused) {
  ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(PlanWithOwners(1, 0)));
  ASSERT_NO_FATAL_FAILURE(AttachEverywhere(0, /*with_bias=*/true));
  v1::AttachRequest smaller = AttachRequestOf(1, 0, /*with_bias=*/true);
  smaller.mutable_tensors(0)->set_elements(6);
  ASSERT_TRUE(AttachFromProto(*engines_[1], smaller).ok());
  WriteGradients(0);
  const std::vector<float> before = trainers_[2].param["unr.a"];
  for (const auto& r : StepEverywhere(0)) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("different AdamW tensors"),
              std::string::npos)
        << r.status();
  }
  EXPECT_EQ(trainers_[2].param["unr.a"], before);
  // Attaching again drops worker 1's transport: its peers' first call on
  // theirs may fail, and their trainers retry.
  ASSERT_TRUE(AttachFromProto(*engines_[1], AttachRequestOf(1, 0, true)).ok());
  RunTrainerLoops(0, 0);
}

// Group values are finite, one for every group the trainer attached
// tensors in (or none at all); the AdamW lr is finite and the same on
// every trainer: otherwise refused everywhere, naming it.
TEST_F(StepEngineTest, GroupsAndAdamWLrAreCheckedAndAgreed) {
  ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(PlanWithOwners(1, 0)));
  ASSERT_NO_FATAL_FAILURE(AttachEverywhere());
  WriteGradients(0);
  const std::vector<float> before = trainers_[1].param["rep.b"];
  const std::vector<
      std::pair<std::string, std::function<void(int, v1::StepRequest*)>>>
      cases = {
          {"groups[0].adamw_weight_decay: inf",
           [](int, v1::StepRequest* r) {
             r->add_groups()->set_adamw_weight_decay(INFINITY);
           }},
          {"adamw_lr: nan",
           [](int w, v1::StepRequest* r) {
             if (w == 2) r->set_adamw_lr(NAN);
           }},
          {"adamw_lr or param group values",
           [](int w, v1::StepRequest* r) {
             r->set_adamw_lr(w == 0 ? 1e-3 : 2e-3);
           }},
      };
  for (const auto& [reason, edit] : cases) {
    for (const auto& r : StepEverywhere(0, edit)) {
      ASSERT_FALSE(r.ok()) << reason;
      EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(r.status().message().find(reason), std::string::npos)
          << r.status();
    }
    EXPECT_EQ(trainers_[1].param["rep.b"], before) << reason;
  }
  for (const auto& r : StepEverywhere(0)) EXPECT_TRUE(r.ok()) << r.status();
}

// Parameter groups are attached once; a step's values reach their
// matrices by index: rep.a in group 1 steps with lr 0 (unchanged), rep.b
// in group 0 with weight decay only, the others with the job's values. A
// step that gives fewer values than the groups attached is refused.
TEST_F(StepEngineTest, GroupValuesReachTheMatricesAttachedInThem) {
  groups_ = {{"rep.a", 1}, {"rep.b", 0}};
  ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(PlanWithOwners(1, 0)));
  ASSERT_NO_FATAL_FAILURE(AttachEverywhere());
  WriteGradients(0);
  const std::vector<float> a = trainers_[1].param["rep.a"];
  const std::vector<float> b = trainers_[1].param["rep.b"];
  const std::vector<float> c = trainers_[1].param["unr.a"];
  for (const auto& r : StepEverywhere(
           0, [](int, v1::StepRequest* r) { r->add_groups()->set_lr(-1); })) {
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("groups: 1 entries; the trainer "
                                        "attached tensors in 2 groups"),
              std::string::npos)
        << r.status();
  }
  EXPECT_EQ(trainers_[1].param["rep.a"], a);
  for (const auto& r : StepEverywhere(0, [](int, v1::StepRequest* r) {
         v1::GroupHyperparameters* g0 = r->add_groups();
         g0->set_lr(0.5);
         g0->set_weight_decay(0.2);  // lr 0.5 * 0.2: x 0.9, then the update
         v1::GroupHyperparameters* g1 = r->add_groups();
         g1->set_lr(0);
         g1->set_weight_decay(-1);
       })) {
    ASSERT_TRUE(r.ok()) << r.status();
  }
  EXPECT_EQ(trainers_[1].param["rep.a"], a);  // lr 0
  EXPECT_NE(trainers_[1].param["rep.b"], b);
  EXPECT_NE(trainers_[1].param["unr.a"], c);
}

}  // namespace
}  // namespace worker
}  // namespace muonps
