// What a worker tells the coordinator about itself, in the coordinator's
// own types: its device, its join request (kept for the worker's lifetime
// in the job and in the durable store) and the stats of a step it ran.
// Plain values; thread-compatible.
#ifndef MUONPS_SERVER_COORDINATOR_WORKER_TYPES_H_
#define MUONPS_SERVER_COORDINATOR_WORKER_TYPES_H_

#include <cstdint>
#include <string>

namespace muonps {
namespace coordinator {

// Identity and capacity of the device a worker runs on.
struct WorkerDevice {
  std::string host;
  std::string kind;  // "cuda" or "cpu"
  std::string name;  // GPU model; empty on CPU
  int32_t index = 0;
  std::string uuid;
  int64_t memory_bytes = 0;
  // Shares its GPU with a trainer rank (else a dedicated optimizer worker).
  bool colocated = false;
  // The machine it is in (v1::Device.node); "": unknown.
  std::string node;
  // Its network bandwidth to other nodes, GB/s per direction
  // (v1::Device.network_gbs); 0: unknown.
  double network_gbs = 0;
};

// A worker asking to join a job (JoinJob). Checked by ValidateJoinJob
// (request_validation.h); its cost table is parsed by the membership.
struct JoinRequest {
  std::string job;
  std::string worker_id;
  // The process: a retry from the same one keeps the lease, another one
  // takes over only an expired lease.
  std::string instance_id;
  WorkerDevice device;
  // scheduler::CostTable's JSON lines; empty: none measured.
  std::string cost_table;
  double speed = 0;  // 0: 1
  std::string data_address;
  // Has no trainer: ranked after the workers with trainers.
  bool dedicated = false;
  // The client certificate it joined with (server::PeerCertificate; "" with
  // no mutual TLS): set by the service edge, never by the request. While it
  // is a member, only calls with that certificate act as this worker id.
  std::string certificate;
};

// One step a worker ran, as it reported it (ReportStepStats) and as
// ListWorkers shows it beside the plan's prediction.
struct StepStats {
  int64_t step = 0;
  int64_t plan_version = 0;
  double step_seconds = 0;
  double ns_seconds = 0;
  double predicted_ns_seconds = 0;
  int64_t bytes_moved = 0;
};

}  // namespace coordinator
}  // namespace muonps

#endif  // MUONPS_SERVER_COORDINATOR_WORKER_TYPES_H_
