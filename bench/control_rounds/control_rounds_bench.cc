// bench/control_rounds: what one of a step's control rounds costs as the
// job grows. A GPU job sends its control messages over a TCP mesh of their
// own beside NCCL (transport/split_transport.h), and each round is a
// gather of every rank's message at rank 0 and a broadcast of its answer
// (server/worker/step_control.h): the agreement, the vote and the
// confirmation, three a step. Both pass along the mesh's tree
// (transport/rank_tree.h): a star (rank 0 exchanging with every rank, as
// every GPU job's did before) or a tree of --fanouts children a rank (a
// GPU worker's: worker::kControlTreeFanout). Every rank is a thread of
// this process with its own listener on loopback, running the workers' own
// ControlChannel; each round gathers a vote-sized message (StepVote) from
// every rank and broadcasts a decision-sized one (CommitDecision) back. One
// JSON line per fanout and world size: the median and 90th percentile of
// the round at rank 0, the tree's depth, and the time per message on the
// busiest path (round / (2 depth (fanout + 1)); for a star, round /
// (2 (N - 1)), rank 0's share). On one machine the other ranks' threads
// share its cores with rank 0, so the figures bound from above what N
// hosts pay.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "kernels/cpu/cpu_device_ops.h"
#include "server/worker/step_control.h"
#include "server/worker/step_protocol.h"
#include "transport/loopback_ranks.h"

ABSL_FLAG(std::string, ranks, "2,8,32,64,128,256", "World sizes.");
ABSL_FLAG(std::string, fanouts, "star,16",
          "Control trees: star (rank 0 with every rank) or a fanout.");
ABSL_FLAG(int, rounds, 200, "Timed rounds per world size.");
ABSL_FLAG(int, warmup, 20, "Untimed rounds first.");
ABSL_FLAG(std::string, machine, "", "The machine, for the JSON lines.");

namespace muonps {
namespace {

// One round on one rank: its vote to rank 0 along the tree, then rank 0's
// decision back to every rank.
absl::Status Round(worker::ControlChannel& control) {
  std::vector<worker::StepVote> votes;
  worker::StepVote vote{};
  vote.step_id = 1;
  vote.yes = 1;
  if (absl::Status s = control.Gather(vote, &votes); !s.ok()) return s;
  worker::CommitDecision decision{};
  decision.step_id = 1;
  return control.Broadcast(&decision, 0);
}

int Main() {
  uint64_t session = 1;
  const std::string machine = absl::GetFlag(FLAGS_machine);
  for (const absl::string_view f :
       absl::StrSplit(absl::GetFlag(FLAGS_fanouts), ',')) {
    int fanout = 0;  // a star
    if (f != "star" && (!absl::SimpleAtoi(f, &fanout) || fanout < 1)) {
      std::fprintf(stderr, "--fanouts: \"%s\" is not star or a fanout\n",
                   std::string(f).c_str());
      return 2;
    }
    for (const absl::string_view n :
         absl::StrSplit(absl::GetFlag(FLAGS_ranks), ',')) {
      int world = 0;
      if (!absl::SimpleAtoi(n, &world) || world < 2) {
        std::fprintf(stderr,
                     "--ranks: \"%s\" is not a world size of 2 or more\n",
                     std::string(n).c_str());
        return 2;
      }
      transport::TcpOptions options = transport::LoopbackOptions();
      options.shape =
          transport::MeshShape::Tree(fanout > 0 ? fanout : world - 1);
      const RankTree tree = options.shape.tree(world);
      absl::StatusOr<std::vector<std::unique_ptr<transport::TcpTransport>>>
          connected =
              transport::ConnectLoopbackWorld(world, ++session, options);
      if (!connected.ok()) {
        std::fprintf(stderr, "tree of %d ranks: %s\n", world,
                     connected.status().ToString().c_str());
        return 1;
      }
      const int warmup = absl::GetFlag(FLAGS_warmup);
      const int rounds = absl::GetFlag(FLAGS_rounds);
      std::vector<double> ms;  // rank 0's rounds
      std::vector<absl::Status> failed(world);
      transport::RunOnEveryRank(world, [&](int rank) {
        kernels::CpuDeviceOps ops;
        worker::ControlChannel control((*connected)[rank].get(), &ops,
                                       /*scratch=*/nullptr, absl::Seconds(30));
        for (int i = 0; i < warmup + rounds; ++i) {
          const auto start = std::chrono::steady_clock::now();
          const absl::Status s = Round(control);
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
      const int depth = tree.Depth();
      const int k = std::min(tree.fanout(), world - 1);
      // Messages on the busiest path: for a star rank 0's 2 (N - 1); for a
      // tree each level's (fanout + 1), both ways.
      const double messages =
          depth <= 1 ? 2.0 * (world - 1) : 2.0 * depth * (k + 1);
      std::printf(
          "{\"what\":\"control_round\",\"machine\":\"%s\","
          "\"tree\":\"%s\",\"fanout\":%d,\"depth\":%d,\"ranks\":%d,"
          "\"rounds\":%d,\"vote_bytes\":%zu,\"decision_bytes\":%zu,"
          "\"round_ms_median\":%.4f,\"round_ms_p90\":%.4f,"
          "\"us_per_message_on_the_busiest_path\":%.2f,\"limit\":\"each "
          "rank on the path sends and receives its neighbors' framed messages "
          "one after another; the other ranks' threads share the machine's "
          "cores\"}\n",
          machine.c_str(), fanout > 0 ? "tree" : "star", k, depth, world,
          rounds, sizeof(worker::StepVote), sizeof(worker::CommitDecision),
          median, p90, median * 1e3 / messages);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace muonps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return muonps::Main();
}
