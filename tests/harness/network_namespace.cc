#include "tests/harness/network_namespace.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

extern char** environ;

namespace muonps {
namespace testing {
namespace {

// The command's output and exit status (-1: it could not start).
struct CommandResult {
  int status = -1;
  std::string output;
};

std::string Tool(const std::string& name);

CommandResult Execute(std::vector<std::string> argv) {
  CommandResult result;
  if (!argv.empty() && argv[0].find('/') == std::string::npos) {
    const std::string path = Tool(argv[0]);
    if (!path.empty()) argv[0] = path;
  }
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return result;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDERR_FILENO);
  posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
  std::vector<char*> args;
  for (const std::string& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int spawned =
      posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(pipe_fds[1]);
  if (spawned == 0) {
    char buffer[4096];
    ssize_t n;
    while ((n = read(pipe_fds[0], buffer, sizeof(buffer))) > 0) {
      result.output.append(buffer, static_cast<size_t>(n));
    }
    int status = 0;
    if (waitpid(pid, &status, 0) == pid) {
      result.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    }
  } else {
    result.output = absl::StrCat("cannot start: errno ", spawned);
  }
  close(pipe_fds[0]);
  return result;
}

// The filter rules Partition adds inside the namespace, as iptables
// arguments after the -A/-D and chain.
std::vector<std::vector<std::string>> PartitionRules(
    const std::string& host_address, const std::vector<int>& open_ports) {
  std::vector<std::vector<std::string>> rules;
  for (int port : open_ports) {
    rules.push_back({"OUTPUT", "-p", "tcp", "-d", host_address, "--dport",
                     absl::StrCat(port), "-j", "ACCEPT"});
    rules.push_back({"INPUT", "-p", "tcp", "-s", host_address, "--sport",
                     absl::StrCat(port), "-j", "ACCEPT"});
  }
  rules.push_back({"OUTPUT", "-p", "tcp", "-d", host_address, "-j", "DROP"});
  rules.push_back({"INPUT", "-p", "tcp", "-s", host_address, "-j", "DROP"});
  return rules;
}

// The absolute path of system tool `name` ("" if absent): test sandboxes
// may run with a PATH that lacks the sbin folders.
std::string Tool(const std::string& name) {
  for (const char* dir : {"/usr/sbin/", "/sbin/", "/usr/bin/", "/bin/"}) {
    const std::string path = absl::StrCat(dir, name);
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

}  // namespace

absl::Status RunCommand(const std::vector<std::string>& argv) {
  const CommandResult result = Execute(argv);
  if (result.status == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("`", absl::StrJoin(argv, " "),
                                          "` exited with ", result.status, ": ",
                                          result.output));
}

NetworkNamespace::NetworkNamespace(std::string name, std::string host_link,
                                   int subnet)
    : name_(std::move(name)),
      host_link_(std::move(host_link)),
      host_address_(absl::StrCat("10.231.", subnet, ".1")),
      inside_address_(absl::StrCat("10.231.", subnet, ".2")) {}

absl::StatusOr<std::unique_ptr<NetworkNamespace>> NetworkNamespace::Create(
    int subnet) {
  if (subnet < 0 || subnet > 255) {
    return absl::InvalidArgumentError(
        absl::StrCat("subnet ", subnet, " is not in 0..255"));
  }
  if (geteuid() != 0) {
    return absl::FailedPreconditionError(
        "network namespaces need root (CAP_NET_ADMIN)");
  }
  for (const char* tool : {"ip", "iptables"}) {
    if (Tool(tool).empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("`", tool, "` is not installed"));
    }
  }
  const std::string name = absl::StrCat("muonps-test-", subnet);
  const std::string host_link = absl::StrCat("mpsh", subnet);
  const std::string inside_link = absl::StrCat("mpsi", subnet);
  // A killed earlier run leaves these behind; removing them is harmless.
  Execute({"ip", "link", "del", host_link});
  Execute({"ip", "netns", "del", name});
  // Owned from here: the destructor removes whatever got created.
  std::unique_ptr<NetworkNamespace> ns(
      new NetworkNamespace(name, host_link, subnet));
  const std::vector<std::vector<std::string>> steps = {
      {"ip", "netns", "add", name},
      {"ip", "link", "add", host_link, "type", "veth", "peer", "name",
       inside_link},
      {"ip", "link", "set", inside_link, "netns", name},
      {"ip", "addr", "add", absl::StrCat(ns->host_address_, "/30"), "dev",
       host_link},
      {"ip", "link", "set", host_link, "up"},
      {"ip", "netns", "exec", name, Tool("ip"), "addr", "add",
       absl::StrCat(ns->inside_address_, "/30"), "dev", inside_link},
      {"ip", "netns", "exec", name, Tool("ip"), "link", "set", inside_link,
       "up"},
      {"ip", "netns", "exec", name, Tool("ip"), "link", "set", "lo", "up"},
  };
  for (const std::vector<std::string>& step : steps) {
    absl::Status s = RunCommand(step);
    if (!s.ok()) return s;
  }
  return ns;
}

NetworkNamespace::~NetworkNamespace() {
  Execute({"ip", "link", "del", host_link_});
  Execute({"ip", "netns", "del", name_});
}

std::vector<std::string> NetworkNamespace::Wrap(
    const std::vector<std::string>& argv) const {
  std::vector<std::string> out = {Tool("ip"), "netns", "exec", name_};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

absl::Status NetworkNamespace::Partition(
    const std::vector<int>& open_host_ports) {
  for (const std::vector<std::string>& rule :
       PartitionRules(host_address_, open_host_ports)) {
    std::vector<std::string> argv = {"ip",  "netns",          "exec",
                                     name_, Tool("iptables"), "-A"};
    argv.insert(argv.end(), rule.begin(), rule.end());
    absl::Status s = RunCommand(argv);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status NetworkNamespace::Heal() {
  for (const char* chain : {"INPUT", "OUTPUT"}) {
    absl::Status s = RunCommand(
        {"ip", "netns", "exec", name_, Tool("iptables"), "-F", chain});
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace testing
}  // namespace muonps
