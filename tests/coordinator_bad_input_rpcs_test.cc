// One real muonps-coordinator takes a table of bad requests for every RPC:
// each must be refused with the exact gRPC code and a message naming the
// offending field, and after each one the coordinator still serves and a
// healthy job ("keep") is byte-for-byte what it was. Rows that the API
// documents as idempotent retries must succeed and change nothing.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "muonps/v1/coordinator.grpc.pb.h"
#include "tests/coordinator_bad_input_fixture.h"

namespace muonps {
namespace {

using bad_input_test::CoordinatorBadInputTest;
using bad_input_test::Deterministic;
using bad_input_test::Row;
using grpc::StatusCode;

TEST_F(CoordinatorBadInputTest,
       EveryRpcRefusesBadInputNamingTheFieldAndLeavesHealthyJobUntouched) {
  ASSERT_NO_FATAL_FAILURE(CreateJobs());
  const std::string job_before = Deterministic(keep_job_);
  const std::string plan_before = Deterministic(keep_plan_);
  const std::vector<Row> rows = Rows();
  EXPECT_GE(rows.size(), 60u);
  auto name = [](StatusCode code) {
    return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(absl::StrCat(row.method, ": ", row.what));
    std::string response;
    int plans = 0;
    const grpc::Status status = row.method == "WatchPlan"
                                    ? Watch(row.request, &plans)
                                    : Call(row.method, row.request, &response);
    const StatusCode code = status.error_code();
    const bool code_right = row.malformed
                                ? code == StatusCode::INTERNAL ||
                                      code == StatusCode::INVALID_ARGUMENT
                                : code == row.code;
    const bool names_field =
        status.error_message().find(row.needle) != std::string::npos;
    EXPECT_TRUE(code_right && names_field)
        << "expected " << name(row.code) << " naming \"" << row.needle
        << "\"; got " << name(code) << ": " << status.error_message();
    EXPECT_EQ(plans, 0);
    if (status.ok() && row.check_response) row.check_response(response);
    ASSERT_TRUE(coordinator_->running()) << "the coordinator died; log:\n"
                                         << coordinator_->Log();
    ASSERT_TRUE(Serving());
    EXPECT_EQ(Deterministic(KeepJob()), job_before) << "job keep changed";
    EXPECT_EQ(Deterministic(KeepPlan()), plan_before) << "plan changed";
  }
  // No refused request left a job behind, and the retries added nothing.
  const auto jobs = Ok<v1::ListJobsRequest, v1::ListJobsResponse>(
      "ListJobs", v1::ListJobsRequest());
  std::vector<std::string> names;
  for (const v1::JobSummary& summary : jobs.jobs()) {
    names.push_back(summary.name());
  }
  EXPECT_EQ(names, (std::vector<std::string>{"boot", "idle", "keep"}));
}

}  // namespace
}  // namespace muonps
