// ValidateJobSpec and ValidateCreateJob (request_validation.h): a valid
// spec converted matrix by matrix with its defaults filled in, and every
// field out of range (names, shapes, dtypes, layouts, Muon and AdamW
// hyperparameters, bucket bytes, request ids) rejected naming its path.
#include <functional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator/request_validation.h"
#include "server/coordinator/validation_test_util.h"

namespace muonps {
namespace coordinator {
namespace {

using ::testing::HasSubstr;
using validation_test::CheckCreateJob;
using validation_test::CheckSpec;
using validation_test::IsFieldError;
using validation_test::kInf;
using validation_test::kNaN;
using validation_test::SmallLimits;

v1::JobSpec ValidSpec() {
  v1::JobSpec spec;
  spec.set_name("llama-7b.run_1");
  v1::Matrix* embed = spec.add_matrices();
  embed->set_name("embed");
  embed->set_rows(4096);
  embed->set_cols(1024);
  embed->set_dtype(v1::DTYPE_BF16);
  embed->set_layout(v1::LAYOUT_ROW_SHARDED);
  embed->set_layer(0);
  v1::Matrix* experts = spec.add_matrices();
  experts->set_name("layers.0.moe.experts");
  experts->set_rows(256);
  experts->set_cols(512);
  experts->set_experts(8);
  experts->set_dtype(v1::DTYPE_FP16);
  experts->set_layout(v1::LAYOUT_UNREDUCED);
  experts->set_layer(1);
  v1::Matrix* head = spec.add_matrices();
  head->set_name("head");
  head->set_rows(1);
  head->set_cols(1);
  head->set_layer(2);
  spec.mutable_muon()->set_lr(0.02);
  spec.mutable_muon()->set_momentum(0.95);
  spec.mutable_muon()->set_ns_steps(5);
  spec.mutable_adamw()->set_lr(3e-4);
  spec.mutable_adamw()->set_beta1(0.9);
  spec.mutable_adamw()->set_beta2(0.999);
  spec.mutable_adamw()->set_eps(1e-8);
  spec.set_bucket_bytes(int64_t{64} << 20);
  return spec;
}

// Applies `mutate` to a valid spec and validates it against SmallLimits().
absl::Status SpecStatus(const std::function<void(v1::JobSpec*)>& mutate) {
  v1::JobSpec spec = ValidSpec();
  mutate(&spec);
  return CheckSpec(spec, SmallLimits()).status();
}

TEST(ValidateJobSpecTest, ConvertsEveryMatrixInOrderWithItsFields) {
  absl::StatusOr<std::vector<scheduler::MatrixSpec>> matrices =
      CheckSpec(ValidSpec(), SmallLimits());
  ASSERT_TRUE(matrices.ok()) << matrices.status();
  ASSERT_EQ(matrices->size(), 3u);
  const scheduler::MatrixSpec& embed = (*matrices)[0];
  EXPECT_EQ(embed.name, "embed");
  EXPECT_EQ(embed.rows, 4096);
  EXPECT_EQ(embed.cols, 1024);
  EXPECT_EQ(embed.experts, 1);
  EXPECT_EQ(embed.dtype, DType::kBFloat16);
  EXPECT_EQ(embed.layout, scheduler::Layout::kRowSharded);
  EXPECT_EQ(embed.layer, 0);
  const scheduler::MatrixSpec& experts = (*matrices)[1];
  EXPECT_EQ(experts.name, "layers.0.moe.experts");
  EXPECT_EQ(experts.experts, 8);
  EXPECT_EQ(experts.dtype, DType::kFloat16);
  EXPECT_EQ(experts.layout, scheduler::Layout::kUnreduced);
  EXPECT_EQ(experts.layer, 1);
}

TEST(ValidateJobSpecTest, FillsDefaultsOneExpertFp32AndReplicated) {
  v1::JobSpec spec = ValidSpec();
  v1::Matrix* head = spec.mutable_matrices(2);
  head->set_experts(0);
  head->set_dtype(v1::DTYPE_UNSPECIFIED);
  head->set_layout(v1::LAYOUT_UNSPECIFIED);
  spec.mutable_matrices(0)->set_experts(1);
  spec.mutable_matrices(0)->set_dtype(v1::DTYPE_FP32);
  spec.mutable_matrices(0)->set_layout(v1::LAYOUT_REPLICATED);
  absl::StatusOr<std::vector<scheduler::MatrixSpec>> matrices =
      CheckSpec(spec, SmallLimits());
  ASSERT_TRUE(matrices.ok()) << matrices.status();
  for (int i : {0, 2}) {
    SCOPED_TRACE(i);
    EXPECT_EQ((*matrices)[i].experts, 1);
    EXPECT_EQ((*matrices)[i].dtype, DType::kFloat32);
    EXPECT_EQ((*matrices)[i].layout, scheduler::Layout::kReplicated);
  }
}

TEST(ValidateJobSpecTest, RejectsBadJobNameAndEmptyOrTooManyMatrices) {
  EXPECT_THAT(SpecStatus([](v1::JobSpec* s) { s->set_name(""); }),
              IsFieldError(absl::StatusCode::kInvalidArgument, "job.name"));
  EXPECT_THAT(SpecStatus([](v1::JobSpec* s) { s->set_name("jobs/x"); }),
              IsFieldError(absl::StatusCode::kInvalidArgument, "job.name"));
  EXPECT_THAT(SpecStatus([](v1::JobSpec* s) { s->clear_matrices(); }),
              IsFieldError(absl::StatusCode::kInvalidArgument, "job.matrices"));
  Limits two = SmallLimits();
  two.max_matrices_per_job = 2;
  EXPECT_THAT(
      CheckSpec(ValidSpec(), two).status(),
      IsFieldError(absl::StatusCode::kResourceExhausted, "job.matrices"));
}

TEST(ValidateJobSpecTest, MatrixNameLengthControlCharsAndDuplicatesNameIndex) {
  const auto name_error =
      IsFieldError(absl::StatusCode::kInvalidArgument, "job.matrices[2].name");
  auto set_name = [](std::string name) {
    return [name](v1::JobSpec* s) { s->mutable_matrices(2)->set_name(name); };
  };
  EXPECT_THAT(SpecStatus(set_name("")), name_error);
  EXPECT_THAT(SpecStatus(set_name(std::string(33, 'n'))), name_error);
  EXPECT_TRUE(SpecStatus(set_name(std::string(32, 'n'))).ok());
  EXPECT_TRUE(SpecStatus(set_name("layers.3.mlp.up (w) \xc3\xa9")).ok());
  for (const std::string& bad :
       {std::string("a\nb"), std::string("tab\t"), std::string("del\x7f"),
        std::string("nul\0x", 5)}) {
    SCOPED_TRACE(bad);
    const absl::Status status = SpecStatus(set_name(bad));
    EXPECT_THAT(status, name_error);
    EXPECT_THAT(std::string(status.message()), HasSubstr("control character"));
  }
  const absl::Status twice = SpecStatus(set_name("embed"));
  EXPECT_THAT(twice, name_error);
  EXPECT_THAT(std::string(twice.message()), HasSubstr("\"embed\" appears"));
}

TEST(ValidateJobSpecTest, RowsColsExpertsLayerOutOfRangeNameTheirPath) {
  struct Case {
    std::string field;
    std::function<void(v1::Matrix*)> mutate;
    bool ok;
  };
  const std::vector<Case> cases = {
      {"rows", [](v1::Matrix* m) { m->set_rows(0); }, false},
      {"rows", [](v1::Matrix* m) { m->set_rows(-5); }, false},
      {"rows", [](v1::Matrix* m) { m->set_rows(4097); }, false},
      {"rows", [](v1::Matrix* m) { m->set_rows(4096); }, true},
      {"cols", [](v1::Matrix* m) { m->set_cols(0); }, false},
      {"cols", [](v1::Matrix* m) { m->set_cols(4097); }, false},
      {"cols", [](v1::Matrix* m) { m->set_cols(4096); }, true},
      {"experts", [](v1::Matrix* m) { m->set_experts(-1); }, false},
      {"experts", [](v1::Matrix* m) { m->set_experts(65); }, false},
      {"experts", [](v1::Matrix* m) { m->set_experts(64); }, true},
      {"layer", [](v1::Matrix* m) { m->set_layer(-1); }, false},
      {"layer", [](v1::Matrix* m) { m->set_layer((1 << 20) + 1); }, false},
      {"layer", [](v1::Matrix* m) { m->set_layer(1 << 20); }, true},
  };
  for (const Case& c : cases) {
    const absl::Status status =
        SpecStatus([&c](v1::JobSpec* s) { c.mutate(s->mutable_matrices(2)); });
    SCOPED_TRACE(c.field + " -> " + status.ToString());
    if (c.ok) {
      EXPECT_TRUE(status.ok());
    } else {
      EXPECT_THAT(status, IsFieldError(absl::StatusCode::kInvalidArgument,
                                       "job.matrices[2]." + c.field));
    }
  }
  EXPECT_THAT(std::string(SpecStatus([](v1::JobSpec* s) {
                            s->mutable_matrices(2)->set_rows(4097);
                          }).message()),
              HasSubstr("4097 is not in [1, 4096]"));
}

TEST(ValidateJobSpecTest, DTypeAndLayoutOutsideTheEnumsAreRejected) {
  const absl::Status dtype = SpecStatus([](v1::JobSpec* s) {
    s->mutable_matrices(2)->set_dtype(static_cast<v1::DType>(99));
  });
  EXPECT_THAT(dtype, IsFieldError(absl::StatusCode::kInvalidArgument,
                                  "job.matrices[2].dtype"));
  EXPECT_THAT(std::string(dtype.message()), HasSubstr("99"));
  const absl::Status layout = SpecStatus([](v1::JobSpec* s) {
    s->mutable_matrices(1)->set_layout(static_cast<v1::Layout>(-4));
  });
  EXPECT_THAT(layout, IsFieldError(absl::StatusCode::kInvalidArgument,
                                   "job.matrices[1].layout"));
  EXPECT_THAT(std::string(layout.message()), HasSubstr("-4"));
}

TEST(ValidateJobSpecTest, MuonHyperparametersOutsideTheirRangesAreNamed) {
  struct Case {
    std::string field;
    std::function<void(v1::MuonHyperparameters*)> mutate;
  };
  const std::vector<Case> cases = {
      {"job.muon.lr", [](v1::MuonHyperparameters* h) { h->set_lr(-0.1); }},
      {"job.muon.lr", [](v1::MuonHyperparameters* h) { h->set_lr(kNaN); }},
      {"job.muon.lr", [](v1::MuonHyperparameters* h) { h->set_lr(kInf); }},
      {"job.muon.weight_decay",
       [](v1::MuonHyperparameters* h) { h->set_weight_decay(-1); }},
      {"job.muon.weight_decay",
       [](v1::MuonHyperparameters* h) { h->set_weight_decay(kNaN); }},
      {"job.muon.momentum",
       [](v1::MuonHyperparameters* h) { h->set_momentum(1.0); }},
      {"job.muon.momentum",
       [](v1::MuonHyperparameters* h) { h->set_momentum(-0.5); }},
      {"job.muon.momentum",
       [](v1::MuonHyperparameters* h) { h->set_momentum(kNaN); }},
      {"job.muon.ns_steps",
       [](v1::MuonHyperparameters* h) { h->set_ns_steps(101); }},
      {"job.muon.ns_steps",
       [](v1::MuonHyperparameters* h) { h->set_ns_steps(-1); }},
      {"job.muon.adjust_lr_fn",
       [](v1::MuonHyperparameters* h) {
         h->set_adjust_lr_fn(static_cast<v1::LrAdjustment>(7));
       }},
      {"job.muon.ns_algorithm",
       [](v1::MuonHyperparameters* h) {
         h->set_ns_algorithm(static_cast<v1::NsAlgorithm>(9));
       }},
      {"job.muon.ns_eps",
       [](v1::MuonHyperparameters* h) { h->set_ns_eps(-1); }},
      {"job.muon.ns_eps",
       [](v1::MuonHyperparameters* h) { h->set_ns_eps(kNaN); }},
      {"job.muon.ns_coefficients",
       [](v1::MuonHyperparameters* h) {
         h->add_ns_coefficients(3.4445);
         h->add_ns_coefficients(-4.775);
       }},
      {"job.muon.ns_coefficients",
       [](v1::MuonHyperparameters* h) {
         h->add_ns_coefficients(3.4445);
         h->add_ns_coefficients(kInf);
         h->add_ns_coefficients(2.0315);
       }},
  };
  for (const Case& c : cases) {
    const absl::Status status =
        SpecStatus([&c](v1::JobSpec* s) { c.mutate(s->mutable_muon()); });
    SCOPED_TRACE(status.ToString());
    EXPECT_THAT(status,
                IsFieldError(absl::StatusCode::kInvalidArgument, c.field));
  }
  EXPECT_TRUE(SpecStatus([](v1::JobSpec* s) {
                s->mutable_muon()->set_momentum(0.999);
                s->mutable_muon()->set_ns_steps(100);
                s->mutable_muon()->set_ns_algorithm(v1::NS_ALGORITHM_GRAM);
              }).ok());
  EXPECT_THAT(std::string(SpecStatus([](v1::JobSpec* s) {
                            s->mutable_muon()->set_momentum(1.0);
                          }).message()),
              HasSubstr("[0, 1)"));
}

TEST(ValidateJobSpecTest, AdamWHyperparametersOutsideTheirRangesAreNamed) {
  struct Case {
    std::string field;
    std::function<void(v1::AdamWHyperparameters*)> mutate;
  };
  const std::vector<Case> cases = {
      {"job.adamw.lr", [](v1::AdamWHyperparameters* h) { h->set_lr(-1); }},
      {"job.adamw.lr", [](v1::AdamWHyperparameters* h) { h->set_lr(kNaN); }},
      {"job.adamw.weight_decay",
       [](v1::AdamWHyperparameters* h) { h->set_weight_decay(-kInf); }},
      {"job.adamw.eps", [](v1::AdamWHyperparameters* h) { h->set_eps(-1e-8); }},
      {"job.adamw.eps", [](v1::AdamWHyperparameters* h) { h->set_eps(kNaN); }},
      {"job.adamw.beta1",
       [](v1::AdamWHyperparameters* h) { h->set_beta1(1.0); }},
      {"job.adamw.beta1",
       [](v1::AdamWHyperparameters* h) { h->set_beta1(kNaN); }},
      {"job.adamw.beta2",
       [](v1::AdamWHyperparameters* h) { h->set_beta2(1.0); }},
      {"job.adamw.beta2",
       [](v1::AdamWHyperparameters* h) { h->set_beta2(-0.1); }},
  };
  for (const Case& c : cases) {
    const absl::Status status =
        SpecStatus([&c](v1::JobSpec* s) { c.mutate(s->mutable_adamw()); });
    SCOPED_TRACE(status.ToString());
    EXPECT_THAT(status,
                IsFieldError(absl::StatusCode::kInvalidArgument, c.field));
  }
}

TEST(ValidateJobSpecTest, BucketBytesMustBeInZeroToOneTiB) {
  EXPECT_THAT(
      SpecStatus([](v1::JobSpec* s) { s->set_bucket_bytes(-1); }),
      IsFieldError(absl::StatusCode::kInvalidArgument, "job.bucket_bytes"));
  EXPECT_THAT(
      SpecStatus(
          [](v1::JobSpec* s) { s->set_bucket_bytes((int64_t{1} << 40) + 1); }),
      IsFieldError(absl::StatusCode::kInvalidArgument, "job.bucket_bytes"));
  EXPECT_TRUE(SpecStatus([](v1::JobSpec* s) { s->set_bucket_bytes(0); }).ok());
}

TEST(ValidateJobSpecTest, ReplicasNeedTrainersInGroupsOfOneSizeAndNoUnreduced) {
  // ValidSpec's experts are unreduced: a replicas spec makes them row-sharded.
  const auto hsdp = [](int replicas, int trainers) {
    return [=](v1::JobSpec* s) {
      s->mutable_matrices(1)->set_layout(v1::LAYOUT_ROW_SHARDED);
      s->set_replicas(replicas);
      s->set_trainers(trainers);
    };
  };
  EXPECT_TRUE(SpecStatus(hsdp(2, 4)).ok());
  EXPECT_TRUE(SpecStatus(hsdp(4, 4)).ok());
  // 0 and 1: no replica groups, whatever the trainers.
  EXPECT_TRUE(SpecStatus(hsdp(1, 0)).ok());
  EXPECT_TRUE(SpecStatus([](v1::JobSpec* s) { s->set_replicas(0); }).ok());
  EXPECT_THAT(SpecStatus(hsdp(-1, 4)),
              IsFieldError(absl::StatusCode::kInvalidArgument, "job.replicas"));
  // The trainers unset, or not a multiple of the replicas.
  EXPECT_THAT(SpecStatus(hsdp(2, 0)),
              IsFieldError(absl::StatusCode::kInvalidArgument, "job.replicas"));
  const absl::Status uneven = SpecStatus(hsdp(2, 3));
  EXPECT_THAT(uneven,
              IsFieldError(absl::StatusCode::kInvalidArgument, "job.replicas"));
  EXPECT_THAT(uneven.message(), HasSubstr("job.trainers"));
  EXPECT_THAT(SpecStatus([&](v1::JobSpec* s) {
                hsdp(2, 4)(s);
                s->set_dedicated_workers(1);
              }),
              IsFieldError(absl::StatusCode::kInvalidArgument, "job.replicas"));
  const absl::Status unreduced =
      SpecStatus([](v1::JobSpec* s) {  // ValidSpec's experts stay unreduced
        s->set_replicas(2);
        s->set_trainers(4);
      });
  EXPECT_THAT(unreduced,
              IsFieldError(absl::StatusCode::kInvalidArgument, "job.replicas"));
  EXPECT_THAT(unreduced.message(), HasSubstr("layers.0.moe.experts"));
}

TEST(ValidateCreateJobTest, RequestIdOver64BytesIsInvalidAndSpecIsChecked) {
  v1::CreateJobRequest request;
  *request.mutable_job() = ValidSpec();
  request.set_request_id(std::string(64, 'r'));
  EXPECT_TRUE(CheckCreateJob(request, SmallLimits()).ok());
  request.set_request_id(std::string(65, 'r'));
  EXPECT_THAT(CheckCreateJob(request, SmallLimits()),
              IsFieldError(absl::StatusCode::kInvalidArgument, "request_id"));
  request.clear_request_id();
  request.mutable_job()->mutable_matrices(0)->set_cols(0);
  EXPECT_THAT(
      CheckCreateJob(request, SmallLimits()),
      IsFieldError(absl::StatusCode::kInvalidArgument, "job.matrices[0].cols"));
}

}  // namespace
}  // namespace coordinator
}  // namespace muonps
