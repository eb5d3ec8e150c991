// What authenticating every data-plane frame costs (transport/frame_auth.h).
// Prints one JSON line per measure:
//   - "gmac": TagFrame over a payload of each size, GB/s on one core;
//   - "tcp": rank 0 sends `--mib` MiB to rank 1 of a TcpTransport over
//     loopback (tagged and verified frames), against the same bytes over a
//     plain loopback socket pair (no framing, no tag), both timed here.
// Usage: frame_auth_bench [--mib 256] [--repeats 5] [--machine NAME]
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "common/dtype.h"
#include "transport/frame_auth.h"
#include "transport/tcp_transport.h"

namespace muonps {
namespace {

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

double Best(const std::vector<double>& times) {
  double best = times[0];
  for (double t : times) best = std::min(best, t);
  return best;
}

// A connected TCP pair over 127.0.0.1 (blocking, no Nagle).
bool LoopbackPair(int pair[2]) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (listener < 0 ||
      bind(listener, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
      listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) !=
          0) {
    return false;
  }
  pair[0] = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(pair[0], reinterpret_cast<sockaddr*>(&address), length) != 0) {
    return false;
  }
  pair[1] = accept(listener, nullptr, nullptr);
  close(listener);
  const int one = 1;
  for (int i = 0; i < 2; ++i) {
    setsockopt(pair[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  return pair[1] >= 0;
}

int Run(int64_t mib, int repeats, const std::string& machine) {
  std::vector<unsigned char> payload(static_cast<size_t>(mib) << 20, 0x5A);
  transport::FrameKey key = {};
  key[0] = 1;
  for (const size_t bytes :
       {size_t{4} << 10, size_t{1} << 20, payload.size()}) {
    std::vector<double> times;
    for (int r = 0; r < repeats; ++r) {
      const auto start = std::chrono::steady_clock::now();
      auto tag = transport::TagFrame(
          key, {transport::MessageKind::kPointToPoint, 0, bytes},
          payload.data(), bytes);
      if (!tag.ok()) return 1;
      times.push_back(Seconds(start));
    }
    std::printf(
        "{\"bench\":\"frame_auth\",\"machine\":\"%s\",\"measure\":\"gmac\","
        "\"bytes\":%zu,\"seconds\":%.6f,\"gb_per_s\":%.2f,\"limit\":\"one "
        "core's AES-GCM (AES-NI, carry-less multiply)\"}\n",
        machine.c_str(), bytes, Best(times), bytes / Best(times) / 1e9);
  }

  // Two ranks of a TcpTransport over loopback.
  auto l0 = transport::TcpListener::Bind("127.0.0.1", 0);
  auto l1 = transport::TcpListener::Bind("127.0.0.1", 0);
  if (!l0.ok() || !l1.ok()) return 1;
  const std::vector<std::string> addresses = {(*l0)->address(),
                                              (*l1)->address()};
  transport::TcpOptions options;
  options.data_plane_secret = std::string(32, 's');
  std::unique_ptr<transport::TcpTransport> rank1;
  std::thread connect1([&] {
    auto t =
        transport::TcpTransport::Connect(l1->get(), 1, addresses, 1, options);
    if (t.ok()) rank1 = *std::move(t);
  });
  auto rank0 =
      transport::TcpTransport::Connect(l0->get(), 0, addresses, 1, options);
  connect1.join();
  if (!rank0.ok() || rank1 == nullptr) return 1;
  std::vector<unsigned char> landed(payload.size());
  std::vector<double> tagged;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    std::thread receiver([&] {
      (void)rank1->Recv(landed.data(), landed.size() / 4, DType::kFloat32, 0,
                        kHostStream);
    });
    const absl::Status sent = (*rank0)->Send(payload.data(), payload.size() / 4,
                                             DType::kFloat32, 1, kHostStream);
    receiver.join();
    if (!sent.ok()) return 1;
    tagged.push_back(Seconds(start));
  }
  if (std::memcmp(landed.data(), payload.data(), payload.size()) != 0) return 1;

  // The peer: the same bytes over a plain TCP loopback connection.
  int pair[2];
  if (!LoopbackPair(pair)) return 1;
  std::vector<double> plain;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    std::thread receiver([&] {
      size_t done = 0;
      while (done < landed.size()) {
        const ssize_t got =
            read(pair[1], landed.data() + done, landed.size() - done);
        if (got <= 0) return;
        done += static_cast<size_t>(got);
      }
    });
    size_t done = 0;
    while (done < payload.size()) {
      const ssize_t put =
          write(pair[0], payload.data() + done, payload.size() - done);
      if (put <= 0) break;
      done += static_cast<size_t>(put);
    }
    receiver.join();
    plain.push_back(Seconds(start));
  }
  close(pair[0]);
  close(pair[1]);
  std::printf(
      "{\"bench\":\"frame_auth\",\"machine\":\"%s\",\"measure\":\"tcp\","
      "\"bytes\":%zu,\"tagged_seconds\":%.6f,\"tagged_gb_per_s\":%.2f,"
      "\"plain_tcp_seconds\":%.6f,\"plain_tcp_gb_per_s\":%.2f,"
      "\"tagged_over_plain\":%.3f,\"limit\":\"loopback copies; the tag adds "
      "one pass over the payload on each side\"}\n",
      machine.c_str(), payload.size(), Best(tagged),
      payload.size() / Best(tagged) / 1e9, Best(plain),
      payload.size() / Best(plain) / 1e9, Best(tagged) / Best(plain));
  return 0;
}

}  // namespace
}  // namespace muonps

int main(int argc, char** argv) {
  int64_t mib = 256;
  int repeats = 5;
  std::string machine = "unknown";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--mib") (void)absl::SimpleAtoi(argv[i + 1], &mib);
    if (flag == "--repeats") (void)absl::SimpleAtoi(argv[i + 1], &repeats);
    if (flag == "--machine") machine = argv[i + 1];
  }
  return muonps::Run(mib, repeats, machine);
}
