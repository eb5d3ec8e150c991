// A network namespace a failure test makes for itself: one veth link
// between the test's namespace (the "host" side, 10.231.S.1) and a fresh
// namespace (10.231.S.2, with its own loopback up), so a process started
// inside it (Wrap) reaches the test's processes only over that link, and
// the test can cut the link's TCP traffic and heal it again while every
// process keeps running. The namespace, the link and the packet filters go
// when the object is destroyed. Needs root (CAP_NET_ADMIN), `ip` and
// `iptables`; Create fails with FAILED_PRECONDITION naming what is
// missing, so a test can skip. Thread-compatible.
#ifndef MUONPS_TESTS_HARNESS_NETWORK_NAMESPACE_H_
#define MUONPS_TESTS_HARNESS_NETWORK_NAMESPACE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace muonps {
namespace testing {

class NetworkNamespace {
 public:
  // Creates namespace and link for subnet 10.231.`subnet`.0/30 (0..255).
  // Two objects must not use one subnet at a time (tests that use one
  // are tagged "exclusive"); a leftover of a killed earlier run of the same
  // subnet is removed first.
  static absl::StatusOr<std::unique_ptr<NetworkNamespace>> Create(int subnet);

  NetworkNamespace(const NetworkNamespace&) = delete;
  NetworkNamespace& operator=(const NetworkNamespace&) = delete;
  // Deletes the link and the namespace (processes still inside lose it).
  ~NetworkNamespace();

  const std::string& name() const { return name_; }
  // The test's end of the link, where processes inside reach it.
  const std::string& host_address() const { return host_address_; }
  // The namespace's end, where the test's processes reach those inside.
  const std::string& inside_address() const { return inside_address_; }

  // `argv` run inside the namespace: {"ip", "netns", "exec", name, argv...}
  // (argv[0] a path, as ChildProcess::Start takes it).
  std::vector<std::string> Wrap(const std::vector<std::string>& argv) const;

  // Drops every TCP packet across the link except those to or from the
  // host's `open_host_ports` (the coordinator's port: a partitioned worker
  // keeps its lease while it cannot reach the other workers). Connections
  // stay open on both sides and stall, as on a real partition.
  absl::Status Partition(const std::vector<int>& open_host_ports);
  // Removes Partition's filters.
  absl::Status Heal();

 private:
  NetworkNamespace(std::string name, std::string host_link, int subnet);

  const std::string name_;
  const std::string host_link_;
  const std::string host_address_;
  const std::string inside_address_;
};

// Runs `argv` (argv[0] found on PATH) to completion; INTERNAL naming the
// command, its exit status and its output when it fails.
absl::Status RunCommand(const std::vector<std::string>& argv);

}  // namespace testing
}  // namespace muonps

#endif  // MUONPS_TESTS_HARNESS_NETWORK_NAMESPACE_H_
