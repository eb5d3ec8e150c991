// The one place muonps.v1 messages become the C++ types the scheduler and
// the kernels use (and back), with every default of the API filled in here
// (momentum 0.95, Nesterov on, 5 NS steps, eps 1e-7, torch's quintic), so
// no reader of a proto repeats them. Pure functions; thread-safe.
#ifndef MUONPS_PROTO_TRANSLATE_H_
#define MUONPS_PROTO_TRANSLATE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/muon_kernels.h"
#include "muonps/v1/coordinator.pb.h"
#include "muonps/v1/plan.pb.h"
#include "muonps/v1/types.pb.h"
#include "newton_schulz/options.h"
#include "scheduler/plan_types.h"

namespace muonps {
namespace proto {

// fp32 for DTYPE_UNSPECIFIED (the API's default) and for a value outside
// the enum (MatrixFromProto refuses those, naming the field).
DType DTypeFromProto(v1::DType dtype);
v1::DType DTypeToProto(DType dtype);
scheduler::Layout LayoutFromProto(v1::Layout layout);
v1::Layout LayoutToProto(scheduler::Layout layout);
// NS5 for anything but NS_ALGORITHM_GRAM.
NsAlgorithm NsAlgorithmFromProto(v1::NsAlgorithm algorithm);
v1::NsAlgorithm NsAlgorithmToProto(NsAlgorithm algorithm);

// The one conversion of a declared matrix into the planner's: experts 0
// becomes 1, DTYPE_UNSPECIFIED fp32, LAYOUT_UNSPECIFIED replicated; every
// other value passes unchanged (its range is the coordinator's to check).
// INVALID_ARGUMENT naming `field`.dtype or `field`.layout for a value
// outside its enum (e.g. "job.matrices[3].dtype: unknown dtype 9").
absl::StatusOr<scheduler::MatrixSpec> MatrixFromProto(const v1::Matrix& matrix,
                                                      absl::string_view field);

// The job's matrices in job order, each as MatrixFromProto converts it, for
// a spec the coordinator accepted (a value outside an enum, which it
// refuses, would read as the default).
std::vector<scheduler::MatrixSpec> MatricesFromJob(const v1::JobSpec& job);

// `matrix` as a job spec declares it, every field set.
v1::Matrix MatrixToProto(const scheduler::MatrixSpec& matrix);

// The job's Muon hyperparameters with the API's defaults filled in
// (ns.algorithm is left at NS5: the plan picks per batch).
kernels::MuonHyperparameters MuonFromProto(const v1::MuonHyperparameters& h);

// Owners by matrix and expert (ranks = indices into plan.workers()), in
// the order of `matrices`, the owner groups (OwnershipPlan::groups, by
// rank), the exchange nodes (OwnershipPlan::exchange_nodes, by rank), and
// the plan's batches (worker, shape, members, parts, predicted
// seconds; a batch without parts, from a coordinator that predates them,
// gets one part of every member with its `algorithm`). INVALID_ARGUMENT
// naming the plan field when the plan names a matrix, expert or worker the
// job does not have. Whether the batches agree with the owners, and the
// groups with the workers and owners (scheduler::CheckOwnerGroups) and the
// exchange nodes with the workers (scheduler::CheckExchangeNodes), is
// scheduler::BuildStepSchedule's to check.
absl::StatusOr<scheduler::OwnershipPlan> OwnershipFromPlan(
    const v1::Plan& plan, const std::vector<scheduler::MatrixSpec>& matrices);

// `batch` as a plan carries it: the worker by id (`worker_ids`, indexed by
// batch.worker), members named "name" or "name[expert]" (for matrices with
// experts > 1) after `matrices`, every part, and `algorithm` set to the
// first part's.
v1::Batch BatchToProto(const scheduler::Batch& batch,
                       const std::vector<std::string>& worker_ids,
                       const std::vector<scheduler::MatrixSpec>& matrices);

}  // namespace proto
}  // namespace muonps

#endif  // MUONPS_PROTO_TRANSLATE_H_
