// The one place the client's public values (client/client_types.h) become
// the service's own types (scheduler, kernels, common, credentials) and
// back. Pure functions; thread-safe. Private to the client target.
#ifndef MUONPS_CLIENT_INTERNAL_TYPES_H_
#define MUONPS_CLIENT_INTERNAL_TYPES_H_

#include <optional>

#include "client/client_types.h"
#include "common/device.h"
#include "common/dtype.h"
#include "kernels/muon_kernels.h"
#include "proto/credentials.h"
#include "scheduler/plan_types.h"

namespace muonps {
namespace client_internal {

scheduler::Layout ToLayout(TensorLayout layout);
DType ToDType(BufferDType dtype);
// kFloat32 for anything but bf16 (a lent buffer is one of the two).
BufferDType ToBufferDType(DType dtype);
kernels::LrAdjustment ToLrAdjustment(AdjustLr adjust);
// Unset for kAuto: the plan picks per shape.
std::optional<NsAlgorithm> ToNsAlgorithm(NewtonSchulz algorithm);
NewtonSchulz FromNsAlgorithm(NsAlgorithm algorithm);
// torch's Muon arguments as the kernels take them (ns.algorithm stays at
// its default: ToNsAlgorithm says what the job forces).
kernels::MuonHyperparameters ToMuonHyperparameters(const MuonOptions& muon);
kernels::AdamWHyperparameters ToAdamWHyperparameters(const AdamWOptions& a);
SecurityConfig ToSecurityConfig(const ClientSecurity& security);

}  // namespace client_internal
}  // namespace muonps

#endif  // MUONPS_CLIENT_INTERNAL_TYPES_H_
