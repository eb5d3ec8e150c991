// Starting the real muonps binaries from multi-process tests: a child
// process with its output in a log file, waiting for a log line, signals,
// and cleanup (every child still running is killed and reaped when its
// ChildProcess is destroyed). Thread-compatible.
#ifndef MUONPS_TESTS_HARNESS_CHILD_PROCESS_H_
#define MUONPS_TESTS_HARNESS_CHILD_PROCESS_H_

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace muonps {
namespace testing {

class ChildProcess {
 public:
  // Starts argv[0] (a path) with the given arguments and this process's
  // environment, each of `env` ("NAME=value") set over it; stdout and stderr
  // go to `log_path` (appended). INTERNAL if fork/exec fails.
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(
      const std::vector<std::string>& argv, const std::string& log_path,
      const std::vector<std::string>& env = {});

  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  // SIGKILLs the child if it still runs, and reaps it.
  ~ChildProcess();

  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }
  // The whole log so far.
  std::string Log() const;

  // Waits until the log holds a line matching `pattern` (ECMAScript regex)
  // and returns the first capture group (or the whole match). DEADLINE_EXCEEDED
  // with the log's tail on timeout; FAILED_PRECONDITION if the child exits
  // first.
  absl::StatusOr<std::string> WaitForLog(const std::string& pattern,
                                         absl::Duration timeout);

  // Sends `signal` to the child.
  void Signal(int signal);
  // Waits for the child to exit and returns its wait status
  // (DEADLINE_EXCEEDED if it does not exit in time).
  absl::StatusOr<int> Wait(absl::Duration timeout);
  bool running();

 private:
  ChildProcess(pid_t pid, std::string log_path)
      : pid_(pid), log_path_(std::move(log_path)) {}
  pid_t pid_;
  std::string log_path_;
  bool reaped_ = false;
  int wait_status_ = 0;
};

// Absolute path of a file of this workspace in the test's runfiles, e.g.
// RunfilePath("server/coordinator/muonps-coordinator").
std::string RunfilePath(const std::string& workspace_relative);

// Where a muonps binary is: $MUONPS_BIN_DIR/<basename> when that is set
// (bundles for the GPU machine carry binaries without Bazel runfiles),
// else RunfilePath(workspace_relative).
std::string BinaryPath(const std::string& workspace_relative);

// Secures this test process and its children with the credentials of
// //tests/testdata:tls (a throwaway CA, the coordinator's certificate and
// key, a bearer token; found with BinaryPath, so GPU bundles carry them
// beside the binaries): sets MUONPS_TOKEN_FILE and MUONPS_TLS_CA_FILE, which
// workers, trainers (muonps::Client) and TestChannel read, and returns the
// flags that make a muonps-coordinator serve TLS and require the token.
std::vector<std::string> SecuredCoordinatorFlags();

// The path of test credential `name` ("ca.pem", "token", "client.pem", ...).
std::string TestCredential(const std::string& name);

// A channel to `target` with the credentials SecuredCoordinatorFlags set up
// (plaintext, no token, before it is called).
std::shared_ptr<grpc::Channel> TestChannel(const std::string& target);

// A muonps-coordinator on a free loopback port, secured as above (no metrics
// port; a 3 s lease renewed every 500 ms), logging to `log_path`, and the
// address it listens on ("127.0.0.1:PORT") once it does, within `timeout`;
// `extra_flags` are added to its command line.
struct RunningCoordinator {
  std::unique_ptr<ChildProcess> process;
  std::string address;
};
absl::StatusOr<RunningCoordinator> StartCoordinator(
    const std::string& log_path, absl::Duration timeout,
    const std::vector<std::string>& extra_flags = {});

// A fresh directory under TEST_TMPDIR (or /tmp), removed by the caller.
std::string NewTempDir(const std::string& prefix);

// A TCP port of `host` (an IPv4 address) that nothing listens on now, taken
// from the 8192 ports below the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range), so no port-0 listener or
// outgoing connection of another process takes it while a server that
// listens there is down: what a server restarted on its port needs.
// INTERNAL when none is free after 100 tries.
absl::StatusOr<int> PortBelowEphemeralRange(const std::string& host);

}  // namespace testing
}  // namespace muonps

#endif  // MUONPS_TESTS_HARNESS_CHILD_PROCESS_H_
