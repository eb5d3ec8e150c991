// The worker's local door, with real processes: a second worker on a live
// socket refuses to start naming it, a killed worker's stale socket is
// replaced, the default socket lives in a private $XDG_RUNTIME_DIR/muonps,
// gRPC answers over the connections the worker accepts itself, and /metrics
// off loopback without a token is refused at start (both binaries).
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/harness/child_process.h"

namespace muonps {
namespace {

using ::muonps::testing::BinaryPath;
using ::muonps::testing::ChildProcess;

constexpr absl::Duration kStartTimeout = absl::Seconds(30);

class WorkerLocalIpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Short: Unix socket paths hold 107 bytes (TEST_TMPDIR's do not fit).
    std::string pattern = "/tmp/muonps-ipc-test-XXXXXX";
    dir_ = mkdtemp(pattern.data());
    absl::StatusOr<testing::RunningCoordinator> coordinator =
        testing::StartCoordinator(dir_ + "/coordinator.log", kStartTimeout);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
  }
  void TearDown() override {
    coordinator_.process.reset();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  std::unique_ptr<ChildProcess> StartWorker(
      const std::string& id, std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {BinaryPath("server/worker/muonps-worker"),
                                     "--coordinator=" + coordinator_.address,
                                     "--job=ipc-test",
                                     "--worker_id=" + id,
                                     "--device=cpu",
                                     "--metrics_port=-1"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    absl::StatusOr<std::unique_ptr<ChildProcess>> started =
        ChildProcess::Start(argv, absl::StrCat(dir_, "/", id, ".log"));
    EXPECT_TRUE(started.ok()) << started.status();
    return started.ok() ? *std::move(started) : nullptr;
  }

  // grpc.health.v1 of muonps.v1.Worker through the Unix socket.
  static bool Serving(const std::string& socket) {
    auto stub = grpc::health::v1::Health::NewStub(grpc::CreateChannel(
        "unix:" + socket, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    grpc::health::v1::HealthCheckRequest request;
    request.set_service("muonps.v1.Worker");
    grpc::health::v1::HealthCheckResponse response;
    const grpc::Status status = stub->Check(&context, request, &response);
    return status.ok() &&
           response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
  }

  std::string dir_;
  testing::RunningCoordinator coordinator_;
};

TEST_F(WorkerLocalIpcTest,
       LiveSocketRefusesASecondWorkerAndStaleOneIsReplaced) {
  const std::string socket = dir_ + "/w.sock";
  std::unique_ptr<ChildProcess> first =
      StartWorker("w0", {"--socket=" + socket});
  ASSERT_NE(first, nullptr);
  ASSERT_TRUE(first->WaitForLog("listening on unix:", kStartTimeout).ok());
  EXPECT_TRUE(Serving(socket));

  std::unique_ptr<ChildProcess> second =
      StartWorker("w1", {"--socket=" + socket});
  ASSERT_NE(second, nullptr);
  absl::StatusOr<int> exited = second->Wait(kStartTimeout);
  ASSERT_TRUE(exited.ok()) << exited.status();
  EXPECT_TRUE(WIFEXITED(*exited) && WEXITSTATUS(*exited) != 0);
  EXPECT_NE(second->Log().find(socket), std::string::npos) << second->Log();
  EXPECT_NE(second->Log().find("live process"), std::string::npos)
      << second->Log();
  EXPECT_TRUE(Serving(socket)) << "the refused worker broke the live one";

  first->Signal(SIGKILL);  // leaves its socket file behind
  ASSERT_TRUE(first->Wait(kStartTimeout).ok());
  struct stat info;
  ASSERT_EQ(lstat(socket.c_str(), &info), 0);
  std::unique_ptr<ChildProcess> third =
      StartWorker("w2", {"--socket=" + socket});
  ASSERT_NE(third, nullptr);
  ASSERT_TRUE(third->WaitForLog("listening on unix:", kStartTimeout).ok())
      << third->Log();
  EXPECT_TRUE(Serving(socket));
}

TEST_F(WorkerLocalIpcTest, DefaultSocketIsInAPrivateXdgRuntimeDirectory) {
  const std::string runtime = dir_ + "/run";
  ASSERT_EQ(mkdir(runtime.c_str(), 0755), 0);
  setenv("XDG_RUNTIME_DIR", runtime.c_str(), 1);
  std::unique_ptr<ChildProcess> worker = StartWorker("w0");
  unsetenv("XDG_RUNTIME_DIR");
  ASSERT_NE(worker, nullptr);
  absl::StatusOr<std::string> socket =
      worker->WaitForLog(R"(listening on unix:(\S+))", kStartTimeout);
  ASSERT_TRUE(socket.ok()) << socket.status();
  EXPECT_EQ(*socket, runtime + "/muonps/worker-w0.sock");
  struct stat info;
  ASSERT_EQ(lstat((runtime + "/muonps").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 07777, 0700u);
  ASSERT_EQ(lstat(socket->c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u);
  EXPECT_TRUE(Serving(*socket));
}

TEST_F(WorkerLocalIpcTest, WorldOpenSocketDirectoryIsRefusedNamingIt) {
  const std::string runtime = dir_ + "/run";
  ASSERT_EQ(mkdir(runtime.c_str(), 0755), 0);
  ASSERT_EQ(mkdir((runtime + "/muonps").c_str(), 0700), 0);
  ASSERT_EQ(chmod((runtime + "/muonps").c_str(), 0777), 0);
  setenv("XDG_RUNTIME_DIR", runtime.c_str(), 1);
  std::unique_ptr<ChildProcess> worker = StartWorker("w0");
  unsetenv("XDG_RUNTIME_DIR");
  ASSERT_NE(worker, nullptr);
  absl::StatusOr<int> exited = worker->Wait(kStartTimeout);
  ASSERT_TRUE(exited.ok()) << exited.status();
  EXPECT_TRUE(WIFEXITED(*exited) && WEXITSTATUS(*exited) != 0);
  EXPECT_NE(worker->Log().find(runtime + "/muonps\" has mode 0777"),
            std::string::npos)
      << worker->Log();
}

TEST_F(WorkerLocalIpcTest, MetricsOffLoopbackWithoutTokenRefusedAtStart) {
  unsetenv("MUONPS_METRICS_TOKEN_FILE");
  std::unique_ptr<ChildProcess> worker =
      StartWorker("w0", {"--socket=" + dir_ + "/w.sock", "--metrics_port=0",
                         "--metrics_address=0.0.0.0:0"});
  ASSERT_NE(worker, nullptr);
  absl::StatusOr<int> exited = worker->Wait(kStartTimeout);
  ASSERT_TRUE(exited.ok()) << exited.status();
  EXPECT_TRUE(WIFEXITED(*exited) && WEXITSTATUS(*exited) == 2);
  EXPECT_NE(worker->Log().find("--metrics_token_file"), std::string::npos)
      << worker->Log();

  std::vector<std::string> argv = testing::SecuredCoordinatorFlags();
  argv.insert(argv.begin(),
              {BinaryPath("server/coordinator/muonps-coordinator"), "--port=0",
               "--metrics_address=0.0.0.0:0"});
  absl::StatusOr<std::unique_ptr<ChildProcess>> coordinator =
      ChildProcess::Start(argv, dir_ + "/open-coordinator.log");
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  exited = (*coordinator)->Wait(kStartTimeout);
  ASSERT_TRUE(exited.ok()) << exited.status();
  EXPECT_TRUE(WIFEXITED(*exited) && WEXITSTATUS(*exited) == 2);
  EXPECT_NE((*coordinator)->Log().find("not a loopback address"),
            std::string::npos)
      << (*coordinator)->Log();
}

}  // namespace
}  // namespace muonps
