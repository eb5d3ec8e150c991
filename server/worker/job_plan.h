// The job and plan version a worker follows, as its core reads them: the
// domain form of the coordinator's muonps.v1.JobSpec and Plan, converted
// once where they arrive (server/worker/wire.h, called by the agent), with
// the API's defaults filled in. Plain values; thread-compatible.
#ifndef MUONPS_SERVER_WORKER_JOB_PLAN_H_
#define MUONPS_SERVER_WORKER_JOB_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/muon_kernels.h"
#include "scheduler/plan_types.h"

namespace muonps {
namespace worker {

// What of the job's spec the workers use.
struct JobSettings {
  std::string name;
  std::vector<scheduler::MatrixSpec> matrices;  // job order
  kernels::MuonHyperparameters muon;            // defaults filled in
  int64_t bucket_bytes = int64_t{64} << 20;     // of the step schedule
  // The plan's: every update at the commit (Plan.apply_at_commit).
  bool apply_at_commit = false;
  int dedicated_workers = 0;  // workers with no trainer
  // HSDP's replica groups of the trainers (JobSpec.replicas): > 1, the
  // plan's owner groups are they, and a row-sharded matrix's rows are split
  // over the trainers / replicas ranks of one. 0 or 1: none.
  int replicas = 0;
  // A matrix whose owner left and whose momentum no checkpoint holds
  // starts from zero (true) or fails the step (false).
  bool allow_momentum_reset = false;
  // Momentum checkpoints: absolute directory ("": none), and every how
  // many committed steps (0: only when asked).
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
};

// Which workers a plan version has, and why it was made.
struct PlanMembership {
  int64_t version = 0;
  std::vector<std::string> workers;  // by rank
  std::string reason;
};

struct JobPlan {
  JobSettings job;
  PlanMembership membership;
  // Owners by matrix and expert (ranks index membership.workers), and the
  // plan's batches.
  scheduler::OwnershipPlan ownership;
};

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_JOB_PLAN_H_
