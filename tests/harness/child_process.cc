#include "tests/harness/child_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <random>
#include <regex>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "proto/credentials.h"

namespace muonps {
namespace testing {

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(
    const std::vector<std::string>& argv, const std::string& log_path,
    const std::vector<std::string>& env) {
  // The child's environment, built before fork (the child only execs):
  // this process's, less each name `env` sets, then `env`.
  std::vector<absl::string_view> names;  // "NAME=" of each entry of `env`
  for (const std::string& set : env) {
    const size_t eq = set.find('=');
    if (eq == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("env: \"", set, "\" is not NAME=value"));
    }
    names.push_back(absl::string_view(set).substr(0, eq + 1));
  }
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) {
    const absl::string_view entry(*e);
    if (std::none_of(names.begin(), names.end(), [&](absl::string_view name) {
          return absl::StartsWith(entry, name);
        })) {
      envp.push_back(*e);
    }
  }
  for (const std::string& set : env) {
    envp.push_back(const_cast<char*>(set.c_str()));
  }
  envp.push_back(nullptr);
  const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot open ", log_path));
  }
  std::vector<char*> args;
  for (const std::string& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(fd);
    return absl::InternalError("fork failed");
  }
  if (pid == 0) {
    // The child: its own process group, output to the log, then exec.
    setpgid(0, 0);
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    close(fd);
    execve(args[0], args.data(), envp.data());
    _exit(127);
  }
  close(fd);
  return std::unique_ptr<ChildProcess>(new ChildProcess(pid, log_path));
}

ChildProcess::~ChildProcess() {
  if (!reaped_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, &wait_status_, 0);
  }
}

std::string ChildProcess::Log() const {
  std::ifstream in(log_path_);
  return std::string(std::istreambuf_iterator<char>(in),
                     std::istreambuf_iterator<char>());
}

bool ChildProcess::running() {
  if (reaped_) return false;
  if (waitpid(pid_, &wait_status_, WNOHANG) == pid_) reaped_ = true;
  return !reaped_;
}

absl::StatusOr<std::string> ChildProcess::WaitForLog(const std::string& pattern,
                                                     absl::Duration timeout) {
  const std::regex re(pattern);
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    const std::string log = Log();
    std::smatch match;
    if (std::regex_search(log, match, re)) {
      return match.size() > 1 ? match[1].str() : match[0].str();
    }
    if (!running()) {
      return absl::FailedPreconditionError(
          absl::StrCat("process ", pid_, " exited (status ", wait_status_,
                       ") before logging /", pattern, "/; log:\n", log));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("no line matching /", pattern, "/ in ",
                       absl::FormatDuration(timeout), "; log tail:\n",
                       log.substr(log.size() > 4000 ? log.size() - 4000 : 0)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

void ChildProcess::Signal(int signal) {
  if (!reaped_) kill(pid_, signal);
}

absl::StatusOr<int> ChildProcess::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (running()) {
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("process ", pid_, " still runs after ",
                       absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return wait_status_;
}

std::string RunfilePath(const std::string& workspace_relative) {
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* workspace = getenv("TEST_WORKSPACE");
  if (srcdir == nullptr) return workspace_relative;
  return absl::StrCat(srcdir, "/", workspace ? workspace : "muonps", "/",
                      workspace_relative);
}

std::string BinaryPath(const std::string& workspace_relative) {
  const char* dir = getenv("MUONPS_BIN_DIR");
  if (dir == nullptr || *dir == 0) return RunfilePath(workspace_relative);
  const size_t slash = workspace_relative.rfind('/');
  return absl::StrCat(dir, "/",
                      slash == std::string::npos
                          ? workspace_relative
                          : workspace_relative.substr(slash + 1));
}

std::string TestCredential(const std::string& name) {
  return BinaryPath("tests/testdata/tls/" + name);
}

std::vector<std::string> SecuredCoordinatorFlags() {
  setenv("MUONPS_TOKEN_FILE", TestCredential("token").c_str(), 1);
  setenv("MUONPS_TLS_CA_FILE", TestCredential("ca.pem").c_str(), 1);
  return {"--tls_cert_file=" + TestCredential("server.pem"),
          "--tls_key_file=" + TestCredential("server.key")};
}

std::shared_ptr<grpc::Channel> TestChannel(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(1 << 30);
  args.SetMaxSendMessageSize(1 << 30);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      OpenChannel(target, WithEnvironmentDefaults({}), args);
  if (!channel.ok()) {
    std::fprintf(stderr, "TestChannel(%s): %s\n", target.c_str(),
                 std::string(channel.status().message()).c_str());
    std::abort();
  }
  return *channel;
}

absl::StatusOr<RunningCoordinator> StartCoordinator(
    const std::string& log_path, absl::Duration timeout,
    const std::vector<std::string>& extra_flags) {
  RunningCoordinator out;
  std::vector<std::string> argv = {
      BinaryPath("server/coordinator/muonps-coordinator"), "--port=0",
      "--metrics_port=-1", "--lease_ttl_ms=3000",
      "--heartbeat_interval_ms=500"};
  argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
  for (std::string& flag : SecuredCoordinatorFlags()) {
    argv.push_back(std::move(flag));
  }
  absl::StatusOr<std::unique_ptr<ChildProcess>> started =
      ChildProcess::Start(argv, log_path);
  if (!started.ok()) return started.status();
  out.process = *std::move(started);
  absl::StatusOr<std::string> port =
      out.process->WaitForLog(R"(listening on 127\.0\.0\.1:(\d+))", timeout);
  if (!port.ok()) return port.status();
  out.address = absl::StrCat("127.0.0.1:", *port);
  return out;
}

std::string NewTempDir(const std::string& prefix) {
  const char* base = getenv("TEST_TMPDIR");
  std::string templ =
      absl::StrCat(base ? base : "/tmp", "/", prefix, "-XXXXXX");
  if (mkdtemp(templ.data()) == nullptr) return "";
  return templ;
}

absl::StatusOr<int> PortBelowEphemeralRange(const std::string& host) {
  int low = 32768, high = 60999;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> low >> high;
  const int first = std::max(1024, low - 8192);
  if (first >= low) {
    return absl::InternalError(
        absl::StrCat("no ports below the ephemeral range ", low, "-", high));
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return absl::InternalError(absl::StrCat(host, " is not an IPv4 address"));
  }
  std::mt19937 random(std::random_device{}());
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int port = first + static_cast<int>(random() % (low - first));
    addr.sin_port = htons(static_cast<uint16_t>(port));
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return absl::InternalError("socket() failed");
    const bool free =
        bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
    close(fd);
    if (free) return port;
  }
  return absl::InternalError(absl::StrCat("no free port of ", host, " in ",
                                          first, "-", low - 1,
                                          " after 100 tries"));
}

}  // namespace testing
}  // namespace muonps
