// Runs every grpcurl command line README.md prints against what its
// walkthrough starts (a coordinator with TLS and a bearer token, job "demo"
// created by the muonps CLI, workers w0 and w1), through a client that, like
// grpcurl, knows nothing of the API but what server reflection sends. Proves
// the README's commands work as printed, and that grpcurl users without
// the token, with a wrong one, or without TLS are refused.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "tests/harness/child_process.h"
#include "tests/harness/grpcurl_command.h"
#include "tests/harness/reflection_client.h"

namespace muonps {
namespace {

using ::muonps::testing::ChildProcess;
using ::muonps::testing::GrpcurlCommand;

// What the README's commands name, and what stands in for it here.
constexpr char kReadmeAddress[] = "127.0.0.1:7070";
constexpr char kReadmeCredentials[] = "/tmp/muonps-creds/";
constexpr absl::Duration kCallTimeout = absl::Seconds(10);
constexpr absl::Duration kStartTimeout = absl::Seconds(30);

std::string TestPathOf(const std::string& readme_path) {
  absl::string_view name = readme_path;
  if (!absl::ConsumePrefix(&name, kReadmeCredentials)) return readme_path;
  return testing::TestCredential(std::string(name));
}

// Every line of README.md that starts with "grpcurl ", in order.
std::vector<std::string> ReadmeGrpcurlLines() {
  std::ifstream in(testing::RunfilePath("README.md"));
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (absl::StartsWith(line, "grpcurl ")) lines.push_back(line);
  }
  return lines;
}

int64_t Int64Field(const nlohmann::json& message, const std::string& field) {
  // proto3 JSON prints int64 as a string and leaves zero out.
  if (!message.contains(field)) return 0;
  int64_t value = -1;
  EXPECT_TRUE(absl::SimpleAtoi(message.at(field).get<std::string>(), &value))
      << field << ": " << message.at(field);
  return value;
}

// A plan's workers, sorted (the plan lists them in join order).
std::vector<std::string> WorkersOf(const nlohmann::json& plan) {
  std::vector<std::string> workers =
      plan.value("workers", std::vector<std::string>());
  std::sort(workers.begin(), workers.end());
  return workers;
}

// The workers the README starts for job demo.
std::vector<std::string> DemoWorkers() { return {"w0", "w1"}; }

class ReadmeGrpcurlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::NewTempDir("readme-grpcurl");
    ASSERT_FALSE(dir_.empty());
    // Unix socket paths hold at most 108 bytes, too few under TEST_TMPDIR.
    std::string socket_dir = "/tmp/muonps-readme-XXXXXX";
    ASSERT_NE(mkdtemp(socket_dir.data()), nullptr);
    socket_dir_ = socket_dir;
    // The test's credentials stand in for /tmp/muonps-creds; this also
    // exports MUONPS_TOKEN_FILE and MUONPS_TLS_CA_FILE to the CLI and the
    // workers, as the README's `export` does.
    absl::StatusOr<testing::RunningCoordinator> coordinator =
        testing::StartCoordinator(dir_ + "/coordinator.log", kStartTimeout);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = std::move(coordinator->process);
    address_ = coordinator->address;
  }

  void TearDown() override {
    for (auto& worker : workers_) worker->Signal(SIGTERM);
    // SIGTERM: each worker leaves the job and exits 0 (a sanitizer build
    // on a loaded 2-core machine has taken over 20 s).
    for (auto& worker : workers_) {
      const absl::StatusOr<int> status = worker->Wait(absl::Seconds(60));
      EXPECT_TRUE(status.ok() && WIFEXITED(*status) &&
                  WEXITSTATUS(*status) == 0)
          << "worker did not stop cleanly; log:\n"
          << worker->Log();
    }
    workers_.clear();
    if (coordinator_ != nullptr) {
      coordinator_->Signal(SIGTERM);
      const absl::StatusOr<int> status = coordinator_->Wait(absl::Seconds(10));
      EXPECT_TRUE(status.ok() && WIFEXITED(*status) &&
                  WEXITSTATUS(*status) == 0)
          << "coordinator did not stop cleanly; log:\n"
          << coordinator_->Log();
      coordinator_.reset();
    }
    std::filesystem::remove_all(dir_);
    if (!socket_dir_.empty()) std::filesystem::remove_all(socket_dir_);
  }

  // The rest of the walkthrough: `muonps create-job` with demo.json, then
  // workers w0 and w1, until the job's plan (version 2) holds both.
  void StartDemoJobAndWorkers() {
    auto cli = ChildProcess::Start(
        {testing::RunfilePath("tools/muonps/muonps"), "create-job",
         "--coordinator=" + address_,
         "--spec=" + testing::RunfilePath("examples/jobs/demo.json"),
         "--job_token_file=" + dir_ + "/demo.job-token"},
        dir_ + "/create-job.log");
    ASSERT_TRUE(cli.ok()) << cli.status();
    const absl::StatusOr<int> exit = (*cli)->Wait(kStartTimeout);
    ASSERT_TRUE(exit.ok() && WIFEXITED(*exit) && WEXITSTATUS(*exit) == 0)
        << (*cli)->Log();
    EXPECT_TRUE(absl::StrContains((*cli)->Log(), "created jobs/demo"))
        << (*cli)->Log();
    for (const std::string& id : DemoWorkers()) {
      auto worker = ChildProcess::Start(
          {testing::RunfilePath("server/worker/muonps-worker"),
           "--coordinator=" + address_, "--job=demo", "--worker_id=" + id,
           "--device=cpu", "--metrics_port=0",
           absl::StrCat("--socket=", socket_dir_, "/", id, ".sock")},
          absl::StrCat(dir_, "/", id, ".log"));
      ASSERT_TRUE(worker.ok()) << worker.status();
      workers_.push_back(*std::move(worker));
    }
    GrpcurlCommand get_plan = Secured();
    get_plan.verb = GrpcurlCommand::Verb::kCall;
    get_plan.symbol = "muonps.v1.Coordinator/GetPlan";
    get_plan.data = R"({"job":"demo"})";
    const absl::Time deadline = absl::Now() + kStartTimeout;
    for (std::string last;; absl::SleepFor(absl::Milliseconds(200))) {
      if (absl::Now() > deadline) {
        for (const auto& worker : workers_) last += "\n" + worker->Log();
        FAIL() << "no plan with w0 and w1: " << last;
      }
      absl::StatusOr<std::string> plan =
          testing::RunGrpcurl(get_plan, kCallTimeout);
      last = plan.ok() ? *plan : plan.status().ToString();
      if (plan.ok() &&
          WorkersOf(nlohmann::json::parse(*plan)) == DemoWorkers()) {
        break;
      }
    }
  }

  // A `list` as the README's first line writes it, aimed at this test's
  // coordinator: its CA and token.
  GrpcurlCommand Secured() const {
    GrpcurlCommand command;
    command.cacert = testing::TestCredential("ca.pem");
    std::ifstream token(testing::TestCredential("token"));
    std::string value;
    std::getline(token, value);
    command.headers.emplace_back("authorization", "Bearer " + value);
    command.address = address_;
    command.verb = GrpcurlCommand::Verb::kList;
    return command;
  }

  std::string dir_;
  std::string socket_dir_;
  std::string address_;
  std::unique_ptr<ChildProcess> coordinator_;
  std::vector<std::unique_ptr<ChildProcess>> workers_;
};

// What one README line printed: sensible for what it asked.
void ExpectSensibleOutput(const GrpcurlCommand& command,
                          const std::string& out) {
  ASSERT_FALSE(out.empty());
  switch (command.verb) {
    case GrpcurlCommand::Verb::kList:
      if (command.symbol.empty()) {
        EXPECT_TRUE(absl::StrContains(out, "muonps.v1.Coordinator\n")) << out;
        EXPECT_TRUE(absl::StrContains(out, "grpc.health.v1.Health\n")) << out;
      }
      return;
    case GrpcurlCommand::Verb::kDescribe:
      EXPECT_TRUE(absl::StrContains(out, command.symbol + " is ")) << out;
      if (command.symbol == "muonps.v1.Coordinator") {
        EXPECT_TRUE(absl::StrContains(out, "service Coordinator {")) << out;
        EXPECT_TRUE(
            absl::StrContains(out,
                              "rpc GetPlan(.muonps.v1.GetPlanRequest) returns "
                              "(.muonps.v1.Plan)"))
            << out;
        // The proto's comments reach operators (GetPlan's).
        EXPECT_TRUE(absl::StrContains(
            out, "// One plan version, whole (version 0: the latest)."))
            << out;
      }
      if (command.symbol == "muonps.v1.Plan") {
        EXPECT_TRUE(absl::StrContains(out, "message Plan {")) << out;
        EXPECT_TRUE(absl::StrContains(out, "int64 version = 3")) << out;
      }
      return;
    case GrpcurlCommand::Verb::kCall:
      break;
  }
  const nlohmann::json response = nlohmann::json::parse(out);
  ASSERT_TRUE(response.is_object()) << out;
  if (command.symbol == "muonps.v1.Coordinator/GetPlan") {
    const nlohmann::json request = nlohmann::json::parse(command.data);
    const int64_t version = Int64Field(response, "version");
    EXPECT_GE(version, 1) << out;
    if (request.contains("version")) {
      EXPECT_EQ(version, request.at("version").get<int64_t>()) << out;
    }
    EXPECT_EQ(response.at("name"), absl::StrCat("jobs/demo/plans/", version));
    EXPECT_EQ(WorkersOf(response), DemoWorkers()) << out;
    EXPECT_FALSE(response.value("matrices", nlohmann::json::array()).empty())
        << out;
  } else if (command.symbol == "grpc.health.v1.Health/Check") {
    EXPECT_EQ(response.at("status"), "SERVING") << out;
  } else {
    EXPECT_FALSE(response.empty()) << out;
  }
}

TEST_F(ReadmeGrpcurlTest,
       EveryReadmeGrpcurlLineSucceedsThroughReflectionAlone) {
  const std::vector<std::string> lines = ReadmeGrpcurlLines();
  ASSERT_FALSE(lines.empty()) << "README.md prints no grpcurl command";
  ASSERT_NO_FATAL_FAILURE(StartDemoJobAndWorkers());
  int lists = 0, describes = 0, calls = 0;
  for (const std::string& line : lines) {
    SCOPED_TRACE(line);
    absl::StatusOr<GrpcurlCommand> command =
        testing::ParseGrpcurlLine(line, TestPathOf);
    ASSERT_TRUE(command.ok()) << command.status();
    EXPECT_EQ(command->address, kReadmeAddress);
    command->address = address_;
    const absl::StatusOr<std::string> out =
        testing::RunGrpcurl(*command, kCallTimeout);
    ASSERT_TRUE(out.ok()) << out.status();
    std::cout << "$ " << line << "\n" << *out << "\n";
    ASSERT_NO_FATAL_FAILURE(ExpectSensibleOutput(*command, *out));
    lists += command->verb == GrpcurlCommand::Verb::kList;
    describes += command->verb == GrpcurlCommand::Verb::kDescribe;
    calls += command->verb == GrpcurlCommand::Verb::kCall;
  }
  // The README shows each of grpcurl's three uses.
  EXPECT_GE(lists, 1);
  EXPECT_GE(describes, 1);
  EXPECT_GE(calls, 1);
}

TEST_F(ReadmeGrpcurlTest, ListWithoutTheTokenIsUnauthenticated) {
  GrpcurlCommand command = Secured();
  ASSERT_TRUE(testing::RunGrpcurl(command, kCallTimeout).ok());
  command.headers.clear();
  const absl::StatusOr<std::string> out =
      testing::RunGrpcurl(command, kCallTimeout);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kUnauthenticated)
      << out.status();
}

// Health/Check needs no token, but grpcurl resolves it through reflection,
// which does: without -reflect-header (or -H) it is refused, which is why
// the README's health line sends the token to reflection only.
TEST_F(ReadmeGrpcurlTest, HealthCheckNeedsTheTokenForReflectionOnly) {
  GrpcurlCommand command = Secured();
  command.verb = GrpcurlCommand::Verb::kCall;
  command.symbol = "grpc.health.v1.Health/Check";
  command.data = R"({"service":"muonps.v1.Coordinator"})";
  command.reflect_headers = std::move(command.headers);
  command.headers.clear();
  const absl::StatusOr<std::string> out =
      testing::RunGrpcurl(command, kCallTimeout);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(nlohmann::json::parse(*out).at("status"), "SERVING") << *out;
  command.reflect_headers.clear();
  EXPECT_EQ(testing::RunGrpcurl(command, kCallTimeout).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST_F(ReadmeGrpcurlTest, ListWithAWrongTokenIsUnauthenticated) {
  GrpcurlCommand command = Secured();
  command.headers = {{"authorization", "Bearer not-the-token-0123456789"}};
  const absl::StatusOr<std::string> out =
      testing::RunGrpcurl(command, kCallTimeout);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kUnauthenticated)
      << out.status();
  // Nor is a describe or a method call let through.
  command.verb = GrpcurlCommand::Verb::kCall;
  command.symbol = "muonps.v1.Coordinator/ListJobs";
  EXPECT_EQ(testing::RunGrpcurl(command, kCallTimeout).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST_F(ReadmeGrpcurlTest, PlaintextAgainstTheTlsPortIsUnavailable) {
  GrpcurlCommand command = Secured();
  command.plaintext = true;
  const absl::StatusOr<std::string> out =
      testing::RunGrpcurl(command, kCallTimeout);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kUnavailable)
      << out.status();
}

}  // namespace
}  // namespace muonps
