// Test support: a world of TcpTransport ranks as threads of one process,
// each with its own listener on 127.0.0.1 (port 0). Thread-compatible.
#ifndef MUONPS_TRANSPORT_LOOPBACK_RANKS_H_
#define MUONPS_TRANSPORT_LOOPBACK_RANKS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "transport/tcp_transport.h"

namespace muonps {
namespace transport {

// The data-plane secret every loopback rank holds (test-only; fixed).
constexpr char kLoopbackSecret[] = "loopback ranks' test secret 0123";

// TcpOptions with kLoopbackSecret and the default timeouts.
TcpOptions LoopbackOptions();

// `world` listeners on 127.0.0.1, each on a free port.
absl::StatusOr<std::vector<std::unique_ptr<TcpListener>>> BindLoopbackListeners(
    int world);

// "127.0.0.1:port" of each listener, index = rank.
std::vector<std::string> AddressesOf(
    const std::vector<std::unique_ptr<TcpListener>>& listeners);

// Runs `body(rank)` for every rank in [0, world) on its own thread and
// returns once all have finished.
void RunOnEveryRank(int world, const std::function<void(int rank)>& body);

// Calls TcpTransport::Connect for every rank at once, rank r offering
// `sessions[r]`; returns each rank's result, index = rank.
std::vector<absl::StatusOr<std::unique_ptr<TcpTransport>>> ConnectEveryRank(
    const std::vector<std::unique_ptr<TcpListener>>& listeners,
    const std::vector<uint64_t>& sessions, const TcpOptions& options);

// Binds and connects `world` ranks on one session; the transports, index =
// rank, or the first error.
absl::StatusOr<std::vector<std::unique_ptr<TcpTransport>>> ConnectLoopbackWorld(
    int world, uint64_t session, const TcpOptions& options);

}  // namespace transport
}  // namespace muonps

#endif  // MUONPS_TRANSPORT_LOOPBACK_RANKS_H_
