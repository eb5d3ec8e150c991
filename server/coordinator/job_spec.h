// JobSpec: a job as its trainer declared it (CreateJob), in the
// coordinator's own types. The matrices carry the API's defaults filled in
// (what the planner reads); everything else is kept as given, unset fields
// unset, so that GetJob answers the declaration back byte for byte and a
// client can tell its own job from another run's. Defaults are applied by
// whoever reads a field (planning reads ns_steps, ns_algorithm and
// bucket_bytes). Ranges are checked by ValidateJobSpec
// (request_validation.h). Plain values; thread-compatible.
#ifndef MUONPS_SERVER_COORDINATOR_JOB_SPEC_H_
#define MUONPS_SERVER_COORDINATOR_JOB_SPEC_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/muon_kernels.h"
#include "scheduler/cost_model.h"
#include "scheduler/plan_types.h"

namespace muonps {
namespace coordinator {

// torch.optim.Muon's arguments as declared; a zero or unset value means
// the API's default (muonps.v1.MuonHyperparameters).
struct MuonSettings {
  double lr = 0;
  double weight_decay = 0;
  std::optional<double> momentum;                          // unset: 0.95
  std::optional<bool> nesterov;                            // unset: true
  int32_t ns_steps = 0;                                    // 0: 5
  std::optional<kernels::LrAdjustment> lr_adjustment;      // unset: original
  std::optional<scheduler::AlgorithmPolicy> ns_algorithm;  // unset: auto
  bool polar_express = false;
  double ns_eps = 0;                    // 0: 1e-7
  std::vector<double> ns_coefficients;  // empty, or (a, b, c)
};

// torch.optim.AdamW's arguments, for the tensors the client steps itself.
struct AdamWSettings {
  double lr = 0;
  double beta1 = 0;
  double beta2 = 0;
  double eps = 0;
  double weight_decay = 0;
};

// Which of a matrix's defaults its declaration left unset (experts 0,
// dtype and layout unspecified): the matrix holds the default, the answer
// leaves the field unset again.
struct UnsetMatrixFields {
  bool experts = false;
  bool dtype = false;
  bool layout = false;
};

struct JobSpec {
  std::string name;
  // In job order, defaults filled in (experts >= 1 once validated).
  std::vector<scheduler::MatrixSpec> matrices;
  // Empty, or one entry per matrix.
  std::vector<UnsetMatrixFields> unset;
  MuonSettings muon;
  AdamWSettings adamw;
  int64_t bucket_bytes = 0;  // 0: 64 MiB
  int32_t dedicated_workers = 0;
  // The trainers (their world size); 0: as many as the workers that are
  // not dedicated. Plans rank that many such workers (RankedMembers).
  int32_t trainers = 0;
  // HSDP's replica groups of the trainers: > 1, the trainers form this many
  // groups of trainers / replicas consecutive ranks each, and the plans'
  // owner groups are they once every rank's trainer rank is known
  // (PlanSnapshot::replica_groups). 0 or 1: none.
  int32_t replicas = 0;
  bool allow_momentum_reset = false;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
};

}  // namespace coordinator
}  // namespace muonps

#endif  // MUONPS_SERVER_COORDINATOR_JOB_SPEC_H_
