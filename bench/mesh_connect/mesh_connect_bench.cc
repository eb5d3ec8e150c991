// bench/mesh_connect: how long the workers of one plan version take to
// open their TCP mesh (transport/tcp_mesh.h): every pair of ranks (a CPU
// worker's data plane, the CUDA IPC transport's) or a tree rooted at rank 0
// (the control messages beside NCCL; a star while the ranks are at most
// --fanout + 1). Every rank is a thread of this
// process with its own listener on loopback, all connecting at once, as
// the workers of a new plan version do. One JSON line per shape, world
// size and repeat: connect_ms (from the first rank's start to the last
// rank's return), connections, and whether all connected (`ok`; a full mesh
// of N ranks in one process needs N (N - 1) descriptors, which the
// process's limit may refuse).
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "transport/loopback_ranks.h"

ABSL_FLAG(std::string, ranks, "8,32,64,128", "World sizes.");
ABSL_FLAG(std::string, shapes, "full,tree", "Mesh shapes: full, tree.");
ABSL_FLAG(int, fanout, 16, "A tree's fanout (a GPU worker's control mesh's).");
ABSL_FLAG(int, repeats, 3, "Connects per shape and world size.");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using muonps::transport::MeshShape;
  uint64_t session = 1;
  for (const absl::string_view shape_name :
       absl::StrSplit(absl::GetFlag(FLAGS_shapes), ',')) {
    if (shape_name != "full" && shape_name != "tree") {
      std::fprintf(stderr, "--shapes: \"%s\" is not full or tree\n",
                   std::string(shape_name).c_str());
      return 2;
    }
    const MeshShape shape = shape_name == "tree"
                                ? MeshShape::Tree(absl::GetFlag(FLAGS_fanout))
                                : MeshShape::Full();
    for (const absl::string_view n :
         absl::StrSplit(absl::GetFlag(FLAGS_ranks), ',')) {
      int world = 0;
      if (!absl::SimpleAtoi(n, &world) || world < 1) {
        std::fprintf(stderr, "--ranks: \"%s\" is not a world size\n",
                     std::string(n).c_str());
        return 2;
      }
      const int64_t connections =
          shape.full() ? static_cast<int64_t>(world) * (world - 1) / 2
                       : world - 1;
      for (int r = 0; r < absl::GetFlag(FLAGS_repeats); ++r) {
        muonps::transport::TcpOptions options =
            muonps::transport::LoopbackOptions();
        options.shape = shape;
        const auto start = std::chrono::steady_clock::now();
        const auto connected =
            muonps::transport::ConnectLoopbackWorld(world, ++session, options);
        const double ms = std::chrono::duration<double, std::milli>(
                              std::chrono::steady_clock::now() - start)
                              .count();
        std::printf(
            "{\"what\":\"mesh_connect\",\"shape\":\"%s\",\"ranks\":%d,"
            "\"connections\":%lld,\"connect_ms\":%.1f,\"ok\":%s}\n",
            std::string(shape_name).c_str(), world,
            static_cast<long long>(connections), ms,
            connected.ok() ? "true" : "false");
        std::fflush(stdout);
        if (!connected.ok()) {
          std::fprintf(stderr, "%s mesh of %d ranks: %s\n",
                       std::string(shape_name).c_str(), world,
                       connected.status().ToString().c_str());
        }
      }
    }
  }
  return 0;
}
