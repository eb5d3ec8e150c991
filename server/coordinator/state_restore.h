// Restoring the coordinator's durable state: a JobStore's jobs, members,
// latest plans with their NCCL ids and deleted names' version floors,
// loaded into an empty JobTable as they were acknowledged. Members get a
// fresh lease (leases are not stored); a stored plan marks its job as
// stepped (whether it stepped is not stored: re-plans keep owners); a
// stored plan that no longer fits its job is dropped, logged, its version
// still counted; a job whose stored plan is not of its stored members (a
// crash between the two writes) is left for the caller to re-plan.
#ifndef MUONPS_SERVER_COORDINATOR_STATE_RESTORE_H_
#define MUONPS_SERVER_COORDINATOR_STATE_RESTORE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/coordinator/job_store.h"
#include "server/coordinator/job_table.h"

namespace muonps {
namespace coordinator {

// A restored job to re-plan, at membership generation 1.
struct JobToReplan {
  std::string name;
  uint64_t incarnation = 0;
};

// Loads `stored` into `table` (which must hold no job), every member's
// lease running out `lease_ttl` after `now`. Returns the jobs the caller
// must re-plan (PlanPublisher::PlanAtLeast(name, incarnation, 1)).
// DATA_LOSS naming the job whose stored spec is invalid (what the
// coordinator accepted once it keeps, whatever today's limits: only what
// no limit allows is invalid).
absl::StatusOr<std::vector<JobToReplan>> RestoreState(const StoredState& stored,
                                                      absl::Time now,
                                                      absl::Duration lease_ttl,
                                                      JobTable* table);

}  // namespace coordinator
}  // namespace muonps

#endif  // MUONPS_SERVER_COORDINATOR_STATE_RESTORE_H_
