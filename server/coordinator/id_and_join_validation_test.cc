// ValidateId and ValidateJoinJob (request_validation.h): the ids requests
// name (1 to 128 bytes of [A-Za-z0-9._-]), and a worker's JoinJob request,
// each bad field named and an oversized cost table refused.
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
using ::testing::StartsWith;
using validation_test::CheckJoin;
using validation_test::IsFieldError;
using validation_test::kInf;
using validation_test::kNaN;
using validation_test::SmallLimits;

v1::JoinJobRequest ValidJoin() {
  v1::JoinJobRequest r;
  r.set_job("job-1");
  r.set_worker_id("w0");
  r.set_instance_id("instance-3f2a");
  r.mutable_device()->set_kind("cuda");
  r.mutable_device()->set_index(3);
  r.mutable_device()->set_memory_bytes(int64_t{80} << 30);
  r.set_speed(1.5);
  r.set_data_address("10.0.0.7:7001");
  return r;
}

absl::Status JoinStatus(const std::function<void(v1::JoinJobRequest*)>& mutate,
                        const Limits& limits = SmallLimits()) {
  v1::JoinJobRequest r = ValidJoin();
  mutate(&r);
  return CheckJoin(r, limits);
}

TEST(ValidateIdTest, AcceptsOneTo128BytesOfLettersDigitsDotUnderscoreDash) {
  EXPECT_TRUE(ValidateId("a", "job").ok());
  EXPECT_TRUE(ValidateId("Job-1.run_A9", "job").ok());
  EXPECT_TRUE(ValidateId(std::string(128, 'z'), "job").ok());
}

TEST(ValidateIdTest, RejectsEmptyAnd129ByteIdsNamingFieldAndLength) {
  const absl::Status empty = ValidateId("", "worker_id");
  EXPECT_THAT(empty,
              IsFieldError(absl::StatusCode::kInvalidArgument, "worker_id"));
  EXPECT_THAT(std::string(empty.message()), HasSubstr("got 0"));
  const absl::Status too_long = ValidateId(std::string(129, 'a'), "job");
  EXPECT_THAT(too_long,
              IsFieldError(absl::StatusCode::kInvalidArgument, "job"));
  EXPECT_THAT(std::string(too_long.message()), HasSubstr("got 129"));
}

TEST(ValidateIdTest, RejectsSlashSpaceControlNulAndNonAsciiBytes) {
  for (const std::string& bad :
       {std::string("jobs/x"), std::string("a b"), std::string("a\nb"),
        std::string("a\0b", 3), std::string("caf\xc3\xa9"),
        std::string("x*")}) {
    SCOPED_TRACE(bad);
    const absl::Status status = ValidateId(bad, "worker_id");
    EXPECT_THAT(status,
                IsFieldError(absl::StatusCode::kInvalidArgument, "worker_id"));
    EXPECT_THAT(std::string(status.message()), HasSubstr("[A-Za-z0-9._-]"));
  }
}

TEST(ValidateJoinJobTest, AcceptsAValidCudaOrCpuWorker) {
  EXPECT_TRUE(JoinStatus([](v1::JoinJobRequest*) {}).ok());
  EXPECT_TRUE(JoinStatus([](v1::JoinJobRequest* r) {
                r->mutable_device()->set_kind("cpu");
                r->mutable_device()->set_index(0);
                r->set_speed(0);
                r->set_cost_table(std::string(16, '#'));
                r->set_data_address(std::string(256, 'a'));
              }).ok());
}

TEST(ValidateJoinJobTest, EachBadFieldIsNamed) {
  struct Case {
    std::string field;
    std::function<void(v1::JoinJobRequest*)> mutate;
  };
  const std::vector<Case> cases = {
      {"job", [](v1::JoinJobRequest* r) { r->set_job(""); }},
      {"worker_id", [](v1::JoinJobRequest* r) { r->set_worker_id("w/0"); }},
      {"instance_id", [](v1::JoinJobRequest* r) { r->clear_instance_id(); }},
      {"instance_id",
       [](v1::JoinJobRequest* r) {
         r->set_instance_id(std::string(129, 'i'));
       }},
      {"device.kind",
       [](v1::JoinJobRequest* r) { r->mutable_device()->set_kind("tpu"); }},
      {"device.kind",
       [](v1::JoinJobRequest* r) { r->mutable_device()->clear_kind(); }},
      {"device.memory_bytes",
       [](v1::JoinJobRequest* r) { r->mutable_device()->set_memory_bytes(0); }},
      {"device.memory_bytes",
       [](v1::JoinJobRequest* r) {
         r->mutable_device()->set_memory_bytes(-1);
       }},
      {"device.index",
       [](v1::JoinJobRequest* r) { r->mutable_device()->set_index(-1); }},
      {"speed", [](v1::JoinJobRequest* r) { r->set_speed(kNaN); }},
      {"speed", [](v1::JoinJobRequest* r) { r->set_speed(kInf); }},
      {"speed", [](v1::JoinJobRequest* r) { r->set_speed(-1); }},
      {"data_address",
       [](v1::JoinJobRequest* r) {
         r->set_data_address(std::string(257, 'a'));
       }},
  };
  for (const Case& c : cases) {
    const absl::Status status = JoinStatus(c.mutate);
    SCOPED_TRACE(status.ToString());
    EXPECT_THAT(status,
                IsFieldError(absl::StatusCode::kInvalidArgument, c.field));
  }
}

TEST(ValidateJoinJobTest, CostTableOverTheLimitIsResourceExhausted) {
  const absl::Status status = JoinStatus(
      [](v1::JoinJobRequest* r) { r->set_cost_table(std::string(17, '#')); });
  EXPECT_THAT(status,
              IsFieldError(absl::StatusCode::kResourceExhausted, "cost_table"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("17 bytes"));
  EXPECT_THAT(std::string(status.message()), StartsWith("cost_table: "));
}

}  // namespace
}  // namespace coordinator
}  // namespace muonps
