// Which Coordinator RPC a coordinator_rpc_fuzzer record calls (its tag,
// modulo the count): shared by the fuzzer and the seed generator.
#ifndef MUONPS_FUZZ_COORDINATOR_RPC_TAGS_H_
#define MUONPS_FUZZ_COORDINATOR_RPC_TAGS_H_

#include <cstdint>

namespace muonps {
namespace fuzz {

enum class CoordinatorRpc : uint8_t {
  kCreateJob = 0,
  kGetJob,
  kListJobs,
  kDeleteJob,
  kJoinJob,
  kHeartbeat,
  kLeaveJob,
  kListWorkers,
  kGetPlan,
  kWatchPlan,
  kPutNcclId,
  kGetNcclId,
  kReportStepStats,
  // Not an RPC: the clock moves and expired leases are dropped.
  kAdvanceClock,
};
constexpr int kCoordinatorRpcCount = 14;

}  // namespace fuzz
}  // namespace muonps

#endif  // MUONPS_FUZZ_COORDINATOR_RPC_TAGS_H_
