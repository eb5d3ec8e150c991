// The values muonps::Client (client/client.h) takes and returns: plain
// structs and enums over absl and the standard library only, so that a
// trainer that includes the client sees no gRPC, protobuf, BLAS or CUDA
// header. The client turns them into the service's own types in one place
// (client/internal_types.cc). Plain values; thread-compatible.
#ifndef MUONPS_CLIENT_CLIENT_TYPES_H_
#define MUONPS_CLIENT_CLIENT_TYPES_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"

// The CUDA runtime's stream type is `CUstream_st*` (cudaStream_t); naming
// the struct keeps CUDA headers out of the trainer's build.
struct CUstream_st;

namespace muonps {

// Credential files (the service's proto/credentials.h): the bearer token
// the coordinator and the worker check, the CA of the coordinator's TLS
// certificate, a client certificate and key for mutual TLS. Empty fields
// come from MUONPS_TOKEN_FILE, MUONPS_TLS_CA_FILE, MUONPS_TLS_CERT_FILE
// and MUONPS_TLS_KEY_FILE.
struct ClientSecurity {
  std::string token_file;
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
};

struct ClientOptions {
  std::string coordinator;    // "host:port"
  std::string job;            // created by the first rank to Start
  std::string worker_socket;  // the local worker's Unix socket path
  int trainer_rank = 0;
  int trainer_count = 1;
  // How long Start waits for the worker's plan, and a step for its peers.
  absl::Duration timeout = absl::Seconds(60);
  // Where the trainer's buffers live: "cpu" (one shared-memory segment the
  // client creates) or "cuda:N" (buffers lent with Client::LendCuda; the
  // local worker must run on that same GPU).
  std::string device = "cpu";
  ClientSecurity security;
};

// How a tensor's gradient is spread over the trainers (muonps.v1.Layout).
enum class TensorLayout {
  kReplicated,  // every rank holds the full, reduced gradient
  kUnreduced,   // every rank holds its partial gradient: the workers average
  kRowSharded,  // each rank holds a range of rows (Muon matrices only)
};

// The element type of a CUDA trainer's lent buffers (the shared segment of
// a host trainer is fp32).
enum class BufferDType { kFloat32, kBFloat16 };

struct MatrixOptions {
  TensorLayout layout = TensorLayout::kReplicated;
  int32_t layer = 0;
  int64_t experts = 1;  // > 1: a 3-D stack of expert matrices
  // row_sharded only: the parameter is sharded like the gradient (FSDP,
  // updates scattered), or false: the trainer keeps the whole parameter
  // (sharded gradients only; the full update is broadcast).
  bool shard_params = true;
  // row_sharded stacks only: the ranks split the experts, this rank holding
  // experts [expert_begin, expert_end) whole (torch.chunk of dimension 0,
  // as FSDP2 shards a 3-D parameter), instead of its rows of each expert.
  bool shard_experts = false;
};

// How the learning rate is scaled by a matrix's shape (torch.optim.Muon's
// adjust_lr_fn).
enum class AdjustLr {
  kOriginal,       // lr * sqrt(max(1, rows / cols))
  kMatchRmsAdamW,  // lr * 0.2 * sqrt(max(rows, cols))
};

// The Newton-Schulz iteration a matrix is orthogonalized with: NS5 on the
// matrix, or Gram NS on its Gram matrix (equal in exact arithmetic).
enum class NewtonSchulz {
  kAuto,  // the plan picks per owner and shape (MuonOptions only)
  kNs5,
  kGram,
};

// torch.optim.Muon's arguments, the job's for every matrix.
struct MuonOptions {
  double lr = 1e-3;
  double weight_decay = 0.1;
  double momentum = 0.95;  // taken as given: 0 means no momentum
  bool nesterov = true;
  AdjustLr adjust_lr = AdjustLr::kOriginal;
  int ns_steps = 5;
  // (a, b, c) of every quintic iteration, unless polar_express is set
  // (Polar Express coefficients per iteration).
  std::array<double, 3> ns_coefficients = {3.4445, -4.7750, 2.0315};
  bool polar_express = false;
  double ns_eps = 1e-7;
  NewtonSchulz ns_algorithm = NewtonSchulz::kAuto;
};

// torch.optim.AdamW's arguments: the client's AdamW for the tensors that
// are not Muon matrices (host trainers).
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

// A tensor's lent buffers. For a row_sharded matrix the gradient holds this
// rank's rows only: [row_begin, row_end) of every expert, expert-major, or,
// with shard_experts, experts [expert_begin, expert_end) whole; so does the
// parameter unless shard_params is false.
struct TensorBuffers {
  // Of `dtype`: fp32 in the shared segment; a CUDA trainer's lent buffers
  // are of the dtype it lent them with (cast a bf16 one before use).
  float* param = nullptr;
  float* grad = nullptr;
  BufferDType dtype = BufferDType::kFloat32;
  int64_t elements = 0;        // of grad
  int64_t param_elements = 0;  // of param
  int64_t row_begin = 0;
  int64_t row_end = 0;
  int64_t expert_begin = 0;
  int64_t expert_end = 0;
};

// One parameter group's values for one step, for the tensors put in it
// (Client::SetGroup). A value < 0 keeps the step's own: StepOptions' lr,
// weight_decay and adamw_lr, and Start's AdamW weight decay.
struct GroupHyperparameters {
  // Muon lr and weight decay of the group's matrices.
  double lr = -1;
  double weight_decay = -1;
  // AdamW lr and weight decay of the group's other tensors.
  double adamw_lr = -1;
  double adamw_weight_decay = -1;
};

struct StepOptions {
  // CUDA trainers: the stream the gradients were produced on (nullptr: the
  // legacy default stream). The worker's stream waits for it (for each
  // matrix Client::GradientReady did not mark ready since the previous
  // step, and for everything else), and it waits for the worker's updates,
  // on the device: no host waits.
  CUstream_st* stream = nullptr;
  // CUDA trainers: return once the step is enqueued (the trainer's stream
  // sees the updated parameters when it gets there); Wait() returns the
  // step's result, and the next Step waits for it first.
  bool async = false;
  // CUDA trainers, with `async`: `stream` does not wait for the step's
  // updates here; the trainer makes its streams wait where it reads the
  // parameters (Client::WaitForParameters, e.g. per layer in its next
  // forward), so that forward starts before the last update has landed.
  bool forward_waits = false;
  // Muon lr and weight decay for this step; < 0 keeps the job's defaults.
  double lr = -1;
  double weight_decay = -1;
  // AdamW lr for this step; < 0 keeps Start's.
  double adamw_lr = -1;
  // By group index: the values of each group SetGroup filled. Empty: every
  // tensor takes the step's own values; otherwise one entry at least for
  // every group up to the highest one used.
  std::vector<GroupHyperparameters> groups;
};

struct StepResult {
  // Step(..., {.async = true}) returned before the step finished.
  bool pending = false;
  // The workers had committed this step id before (an earlier call whose
  // answer was lost, or a retry that settled it).
  bool already_applied = false;
  // With already_applied: this trainer had resumed after the step before
  // (Client::ResumeAfter), and its worker repaired the parameters to hold
  // the step from a peer's trainer.
  bool repaired = false;
  // This call stepped the AdamW tensors (host trainers): the first answer
  // that the step id is committed, fresh or already applied. Once per
  // committed step id.
  bool adamw_applied = false;
  double seconds = 0;
  int64_t bytes_moved = 0;
  int64_t momentum_reset = 0;
  int64_t plan_version = 0;
};

}  // namespace muonps

#endif  // MUONPS_CLIENT_CLIENT_TYPES_H_
