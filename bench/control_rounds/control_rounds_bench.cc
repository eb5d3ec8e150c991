// bench/control_rounds: what one of a step's control rounds costs as the
// job grows. A GPU job sends its control messages over a TCP star around
// rank 0 beside NCCL (transport/split_transport.h), and each round is a
// gather of every rank's message at rank 0 and a broadcast of its answer
// (server/worker/step_control.h): the agreement, the vote and the
// confirmation, three a step. Every rank here is a thread of this process
// with its own listener on loopback, connected as a star (as the workers'
// control meshes are); each round gathers a vote-sized message
// (StepVote) from every rank and broadcasts a decision-sized one
// (CommitDecision) back. One JSON line per world size: the median and
// 90th percentile of the round at rank 0, and the rank-0 time per message
// ((round) / (2 (N - 1))). On one machine the other ranks' threads share
// its cores with rank 0, so the figures bound from above what rank 0 of N
// hosts pays.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "server/worker/step_protocol.h"
#include "transport/loopback_ranks.h"

ABSL_FLAG(std::string, ranks, "2,8,32,64,128,256", "World sizes.");
ABSL_FLAG(int, rounds, 200, "Timed rounds per world size.");
ABSL_FLAG(int, warmup, 20, "Untimed rounds first.");
ABSL_FLAG(std::string, machine, "", "The machine, for the JSON lines.");

namespace muonps {
namespace {

constexpr size_t kVoteFloats = sizeof(worker::StepVote) / sizeof(float);
constexpr size_t kDecisionFloats =
    sizeof(worker::CommitDecision) / sizeof(float);

// One round on rank `rank` of `t`: its vote to rank 0 (rank 0 receives
// every other rank's in one group), then rank 0's decision to every rank.
absl::Status Round(transport::TcpTransport& t, std::vector<float>& votes,
                   std::vector<float>& decision) {
  const int size = t.size();
  if (t.rank() != 0) {
    absl::Status s =
        t.Send(votes.data(), kVoteFloats, DType::kFloat32, 0, kHostStream);
    if (!s.ok()) return s;
  } else {
    absl::Status s = t.GroupStart();
    for (int r = 1; r < size && s.ok(); ++r) {
      s = t.Recv(votes.data() + r * kVoteFloats, kVoteFloats, DType::kFloat32,
                 r, kHostStream);
    }
    const absl::Status ended = t.GroupEnd();
    if (!s.ok()) return s;
    if (!ended.ok()) return ended;
  }
  return t.Broadcast(decision.data(), kDecisionFloats, DType::kFloat32, 0,
                     kHostStream);
}

int Main() {
  uint64_t session = 1;
  const std::string machine = absl::GetFlag(FLAGS_machine);
  for (const absl::string_view n :
       absl::StrSplit(absl::GetFlag(FLAGS_ranks), ',')) {
    int world = 0;
    if (!absl::SimpleAtoi(n, &world) || world < 2) {
      std::fprintf(stderr, "--ranks: \"%s\" is not a world size of 2 or more\n",
                   std::string(n).c_str());
      return 2;
    }
    transport::TcpOptions options = transport::LoopbackOptions();
    options.shape = transport::MeshShape::kStar;
    absl::StatusOr<std::vector<std::unique_ptr<transport::TcpTransport>>>
        connected = transport::ConnectLoopbackWorld(world, ++session, options);
    if (!connected.ok()) {
      std::fprintf(stderr, "star of %d ranks: %s\n", world,
                   connected.status().ToString().c_str());
      return 1;
    }
    const int warmup = absl::GetFlag(FLAGS_warmup);
    const int rounds = absl::GetFlag(FLAGS_rounds);
    std::vector<double> ms;  // rank 0's rounds
    std::vector<absl::Status> failed(world);
    transport::RunOnEveryRank(world, [&](int rank) {
      transport::TcpTransport& t = *(*connected)[rank];
      std::vector<float> votes(kVoteFloats * world, 1.0f);
      std::vector<float> decision(kDecisionFloats, 2.0f);
      for (int i = 0; i < warmup + rounds; ++i) {
        const auto start = std::chrono::steady_clock::now();
        const absl::Status s = Round(t, votes, decision);
        if (!s.ok()) {
          failed[rank] = s;
          return;
        }
        if (rank == 0 && i >= warmup) {
          ms.push_back(std::chrono::duration<double, std::milli>(
                           std::chrono::steady_clock::now() - start)
                           .count());
        }
      }
    });
    for (int r = 0; r < world; ++r) {
      if (!failed[r].ok()) {
        std::fprintf(stderr, "%d ranks, rank %d: %s\n", world, r,
                     failed[r].ToString().c_str());
        return 1;
      }
    }
    std::sort(ms.begin(), ms.end());
    const double median = ms[ms.size() / 2];
    const double p90 = ms[ms.size() * 9 / 10];
    std::printf(
        "{\"what\":\"control_round\",\"machine\":\"%s\",\"shape\":\"star\","
        "\"ranks\":%d,\"rounds\":%d,\"vote_bytes\":%zu,\"decision_bytes\":%zu,"
        "\"round_ms_median\":%.4f,\"round_ms_p90\":%.4f,"
        "\"rank0_us_per_message\":%.2f,\"limit\":\"rank 0 sends and receives "
        "2 (N - 1) framed messages a round, one after another; the other "
        "ranks' threads share the machine's cores\"}\n",
        machine.c_str(), world, rounds, kVoteFloats * sizeof(float),
        kDecisionFloats * sizeof(float), median, p90,
        median * 1e3 / (2.0 * (world - 1)));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace muonps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return muonps::Main();
}
