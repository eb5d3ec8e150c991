#include "transport/loopback_ranks.h"

#include <thread>
#include <utility>

namespace muonps {
namespace transport {

TcpOptions LoopbackOptions() {
  TcpOptions options;
  options.data_plane_secret = kLoopbackSecret;
  return options;
}

absl::StatusOr<std::vector<std::unique_ptr<TcpListener>>> BindLoopbackListeners(
    int world) {
  std::vector<std::unique_ptr<TcpListener>> listeners;
  for (int rank = 0; rank < world; ++rank) {
    absl::StatusOr<std::unique_ptr<TcpListener>> listener =
        TcpListener::Bind("127.0.0.1", 0);
    if (!listener.ok()) return listener.status();
    listeners.push_back(*std::move(listener));
  }
  return listeners;
}

std::vector<std::string> AddressesOf(
    const std::vector<std::unique_ptr<TcpListener>>& listeners) {
  std::vector<std::string> addresses;
  for (const auto& listener : listeners) {
    addresses.push_back(listener->address());
  }
  return addresses;
}

void RunOnEveryRank(int world, const std::function<void(int rank)>& body) {
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) threads.emplace_back(body, rank);
  for (std::thread& thread : threads) thread.join();
}

std::vector<absl::StatusOr<std::unique_ptr<TcpTransport>>> ConnectEveryRank(
    const std::vector<std::unique_ptr<TcpListener>>& listeners,
    const std::vector<uint64_t>& sessions, const TcpOptions& options) {
  const int world = static_cast<int>(listeners.size());
  const std::vector<std::string> addresses = AddressesOf(listeners);
  std::vector<absl::StatusOr<std::unique_ptr<TcpTransport>>> results;
  for (int rank = 0; rank < world; ++rank) {
    results.emplace_back(absl::UnknownError("not run"));
  }
  RunOnEveryRank(world, [&](int rank) {
    results[rank] = TcpTransport::Connect(listeners[rank].get(), rank,
                                          addresses, sessions[rank], options);
  });
  return results;
}

absl::StatusOr<std::vector<std::unique_ptr<TcpTransport>>> ConnectLoopbackWorld(
    int world, uint64_t session, const TcpOptions& options) {
  absl::StatusOr<std::vector<std::unique_ptr<TcpListener>>> listeners =
      BindLoopbackListeners(world);
  if (!listeners.ok()) return listeners.status();
  std::vector<absl::StatusOr<std::unique_ptr<TcpTransport>>> results =
      ConnectEveryRank(*listeners, std::vector<uint64_t>(world, session),
                       options);
  std::vector<std::unique_ptr<TcpTransport>> transports;
  for (auto& result : results) {
    if (!result.ok()) return result.status();
    transports.push_back(*std::move(result));
  }
  return transports;
}

}  // namespace transport
}  // namespace muonps
