// The GPU workers' transport per plan version: an NCCL communicator among
// the plan's workers (one rank per GPU; trainers never join it), whose
// unique id travels through the coordinator (rank 0 creates it and
// PutNcclId's it for the plan version; the other ranks GetNcclId until it
// is there). Thread-safe (the factory holds only immutable state).
#ifndef MUONPS_SERVER_WORKER_NCCL_BOOTSTRAP_H_
#define MUONPS_SERVER_WORKER_NCCL_BOOTSTRAP_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "server/worker/join_credentials.h"
#include "server/worker/step_engine.h"

namespace muonps {
namespace worker {

struct NcclBootstrapOptions {
  std::shared_ptr<grpc::Channel> coordinator;
  std::string job;
  std::string worker_id;
  // The worker token the id calls carry (written by the agent at join).
  std::shared_ptr<JoinCredentials> credentials;
  int cuda_device = 0;
  // For the id exchange and for NCCL (communicator setup, stalled steps).
  absl::Duration timeout = absl::Seconds(10);
};

// A TransportFactory building NcclTransports. Its errors name the plan
// version and, when the id never arrives, rank 0's worker. A version the
// coordinator has replaced meanwhile is UNAVAILABLE: the step ran nothing,
// and its retry runs on the new plan.
TransportFactory NcclTransportFactory(NcclBootstrapOptions options);

// Whether a rank other than 0 should start on an id rank 0 put `age` ago
// (zero: not known). Rank 0 waits for its peers one `timeout` from its put
// and then puts the next generation; a peer that started on an id with
// little of that wait left waited its own timeout for nothing, and rank 0
// had meanwhile moved to the next id, a miss that can repeat. So an id with
// less than a quarter of the timeout (at least a second) left is passed
// over for the next generation (a communicator whose ranks have all joined
// takes well under a second to build).
bool IdStillJoinable(absl::Duration age, absl::Duration timeout);

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_NCCL_BOOTSTRAP_H_
