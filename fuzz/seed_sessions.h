// The seed inputs of the multi-record fuzz targets (fuzz/fuzz_input.h's
// framing), built from valid requests: write_seeds writes them under
// fuzz/corpus/. Pure functions; thread-safe.
#ifndef MUONPS_FUZZ_SEED_SESSIONS_H_
#define MUONPS_FUZZ_SEED_SESSIONS_H_

#include <string>
#include <vector>

namespace muonps {
namespace fuzz {

struct NamedSeed {
  std::string name;   // the file name in the target's corpus
  std::string bytes;  // the input
};

std::vector<NamedSeed> CoordinatorSeeds();
std::vector<NamedSeed> PlanDecoderSeeds();
std::vector<NamedSeed> WorkerSeeds();
std::vector<NamedSeed> CAbiSeeds();

}  // namespace fuzz
}  // namespace muonps

#endif  // MUONPS_FUZZ_SEED_SESSIONS_H_
