// The one place muonps.v1 messages become the C++ types the scheduler and
// the kernels use (and back), with every default of the API filled in here
// (momentum 0.95, Nesterov on, 5 NS steps, eps 1e-7, torch's quintic), so
// no reader of a proto repeats them. Pure functions; thread-safe.
#ifndef MUONPS_PROTO_TRANSLATE_H_
#define MUONPS_PROTO_TRANSLATE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/muon_kernels.h"
#include "muonps/v1/coordinator.pb.h"
#include "muonps/v1/plan.pb.h"
#include "muonps/v1/types.pb.h"
#include "scheduler/plan_types.h"

namespace muonps {
namespace proto {

// fp32 for DTYPE_UNSPECIFIED (the API's default); requests are validated
// before they get here (request_validation names an unknown value).
DType DTypeFromProto(v1::DType dtype);
v1::DType DTypeToProto(DType dtype);
scheduler::Layout LayoutFromProto(v1::Layout layout);
v1::Layout LayoutToProto(scheduler::Layout layout);
// NS5 for anything but NS_ALGORITHM_GRAM.
kernels::NsAlgorithm NsAlgorithmFromProto(v1::NsAlgorithm algorithm);
v1::NsAlgorithm NsAlgorithmToProto(kernels::NsAlgorithm algorithm);

// The job's matrices in job order (experts >= 1).
std::vector<scheduler::MatrixSpec> MatricesFromJob(const v1::JobSpec& job);

// The job's Muon hyperparameters with the API's defaults filled in
// (ns.algorithm is left at NS5: the plan picks per batch).
kernels::MuonHyperparameters MuonFromProto(const v1::MuonHyperparameters& h);

// Owners by matrix and expert (ranks = indices into plan.workers()), in
// the order of `matrices`, and the plan's batches (worker, shape, members,
// parts, predicted seconds; a batch without parts, from a coordinator that
// predates them, gets one part of every member with its `algorithm`).
// INVALID_ARGUMENT naming the plan field when the plan names a matrix,
// expert or worker the job does not have. Whether the batches agree with
// the owners is scheduler::BuildStepSchedule's to check.
absl::StatusOr<scheduler::OwnershipPlan> OwnershipFromPlan(
    const v1::Plan& plan, const std::vector<scheduler::MatrixSpec>& matrices);

// `batch` as a plan carries it: the worker by id (`worker_ids`, indexed by
// batch.worker), members named "name" or "name[expert]" (for matrices with
// experts > 1) after `matrices`, every part, and `algorithm` set to the
// first part's.
v1::Batch BatchToProto(const scheduler::Batch& batch,
                       const std::vector<std::string>& worker_ids,
                       const std::vector<scheduler::MatrixSpec>& matrices);

// The step a worker reported, as ListWorkers shows it (WorkerInfo.last_step):
// its step id, plan version, measured seconds, the plan's prediction and
// bytes moved. Copies only; ReportStepStats validates the report first.
v1::WorkerStepStats WorkerStepStatsFromReport(
    const v1::ReportStepStatsRequest& report);

}  // namespace proto
}  // namespace muonps

#endif  // MUONPS_PROTO_TRANSLATE_H_
