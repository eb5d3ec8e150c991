// The service's own option types (scheduler, kernels, newton_schulz,
// common) as the client takes and returns them (client/client_types.h), for
// the tests, benchmarks and examples that run the same values through a
// single-process reference and hand them to muonps::Client: the reference
// keeps the service's values, the client gets these. Pure functions;
// thread-safe. Test-only.
#ifndef MUONPS_TESTS_CLIENT_OPTIONS_H_
#define MUONPS_TESTS_CLIENT_OPTIONS_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "client/client_types.h"
#include "common/dtype.h"
#include "kernels/muon_kernels.h"
#include "newton_schulz/options.h"
#include "scheduler/plan_types.h"

namespace muonps {
namespace testing {

TensorLayout ClientLayout(scheduler::Layout layout);
// kBFloat16 for bf16, kFloat32 for anything else (a lent buffer is one of
// the two).
BufferDType ClientDType(DType dtype);
// torch's Muon arguments of `h`. The NS algorithm is left to the plan
// (NewtonSchulz::kAuto): h.ns.algorithm is what a reference runs a matrix
// with once the plan has picked it (NsAlgorithmsOf).
MuonOptions ClientMuon(const kernels::MuonHyperparameters& h);
AdamWOptions ClientAdamW(const kernels::AdamWHyperparameters& h);
// Client::NsAlgorithms()' answer (or its error) as the kernels run it;
// INTERNAL naming the matrix for kAuto (the plan always picks one).
absl::StatusOr<std::map<std::string, NsAlgorithm>> NsAlgorithmsOf(
    const absl::StatusOr<std::map<std::string, NewtonSchulz>>& algorithms);

}  // namespace testing
}  // namespace muonps

#endif  // MUONPS_TESTS_CLIENT_OPTIONS_H_
