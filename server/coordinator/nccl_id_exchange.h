// NcclIdExchange: the NCCL ids by which a plan version's workers build
// their communicator. Rank 0 of the current plan puts an id (once per
// communicator generation: a communicator rebuilt within a version gets
// the next), the plan's other workers get it; ids are kept with the plan
// version and made durable before the put is acknowledged.
//
// Thread-safe.
#ifndef MUONPS_SERVER_COORDINATOR_NCCL_ID_EXCHANGE_H_
#define MUONPS_SERVER_COORDINATOR_NCCL_ID_EXCHANGE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/coordinator/job_table.h"
#include "server/coordinator/store_queue.h"

namespace muonps {
namespace coordinator {

struct NcclIdPut {
  std::string job;
  int64_t plan_version = 0;
  std::string worker_id;
  std::string worker_token;
  std::string nccl_id;  // an ncclUniqueId's 128 bytes
  int64_t generation = 0;
  std::string certificate;  // the call's (JoinRequest::certificate)
};

struct NcclIdGet {
  std::string job;
  int64_t plan_version = 0;
  // The oldest communicator generation the caller accepts.
  int64_t min_generation = 0;
  std::string worker_id;
  std::string worker_token;
  std::string certificate;  // the call's (JoinRequest::certificate)
};

struct NcclId {
  std::string id;
  int64_t generation = 0;
  // Since rank 0 put it; zero when not known (restored from the store).
  absl::Duration age;
};

class NcclIdExchange {
 public:
  // `table` and `queue` must outlive the exchange.
  NcclIdExchange(JobTable* table, StoreQueue* queue)
      : table_(table), queue_(queue) {}
  NcclIdExchange(const NcclIdExchange&) = delete;
  NcclIdExchange& operator=(const NcclIdExchange&) = delete;

  // Keeps `put.nccl_id` for the current plan version; the same id again
  // for the same generation is a no-op. INVALID_ARGUMENT naming the field
  // (plan_version < 1, an id not of 128 bytes, generation < 0);
  // NOT_FOUND / UNAUTHENTICATED for the job or worker (as Heartbeat);
  // FAILED_PRECONDITION naming plan_version (not the current one),
  // worker_id (not rank 0) or generation (older than the stored one);
  // ALREADY_EXISTS naming nccl_id (another id for the same generation);
  // UNAVAILABLE when the store fails.
  absl::Status PutNcclId(const NcclIdPut& put);

  // The newest id of the current plan version, of generation
  // min_generation or later. INVALID_ARGUMENT naming plan_version;
  // NOT_FOUND / UNAUTHENTICATED for the job or worker; FAILED_PRECONDITION
  // naming plan_version (not the current one); PERMISSION_DENIED naming
  // worker_id (not a worker of the plan); NOT_FOUND naming nccl_id when
  // rank 0 has not put it yet.
  absl::StatusOr<NcclId> GetNcclId(const NcclIdGet& get);

 private:
  JobTable* const table_;
  StoreQueue* const queue_;
};

}  // namespace coordinator
}  // namespace muonps

#endif  // MUONPS_SERVER_COORDINATOR_NCCL_ID_EXCHANGE_H_
