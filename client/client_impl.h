// What a muonps::Client holds (its Impl) and the steps its methods share,
// behind client/client.h's pimpl: the gRPC stubs, the declared tensors,
// the shared segment or the CUDA step signals, the host AdamW state.
// Private to the client target; one trainer thread uses it (an async
// step's thread runs StepOnWorker while the trainer thread waits for it
// before touching anything else), except GradientReady, which reads only
// what Start fixed and records through the thread-safe CudaStepSignals.
#ifndef MUONPS_CLIENT_CLIENT_IMPL_H_
#define MUONPS_CLIENT_CLIENT_IMPL_H_

#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/client.h"
#include "client/cuda_lending.h"
#include "common/device.h"
#include "common/dtype.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/muon_kernels.h"
#include "lending/shared_memory.h"
#include "muonps/v1/coordinator.grpc.pb.h"
#include "muonps/v1/worker.grpc.pb.h"
#include "scheduler/plan_types.h"

namespace muonps {

struct Client::Impl {
  // One declared tensor: a Muon matrix or an AdamW tensor.
  struct Tensor {
    std::string name;
    bool muon = false;
    int64_t rows = 0, cols = 0, experts = 1;  // matrices
    bool shard_experts = false;               // row_sharded stacks
    int32_t layer = 0;
    scheduler::Layout layout = scheduler::Layout::kReplicated;
    int64_t elements = 0;        // this rank's gradient elements
    int64_t param_elements = 0;  // this rank's parameter elements
    int64_t offset = 0;          // grad at offset, param right after it
    int group = -1;              // SetGroup's index; -1: in no group
    void* cuda_grad = nullptr;   // LendCuda's buffers (CUDA trainers)
    void* cuda_param = nullptr;
    DType dtype = DType::kFloat32;  // of the lent buffers
    // CUDA job matrices, from Start: the index of this gradient's event in
    // `signals` (GradientReady); -1: none.
    int gradient_event = -1;
    std::vector<float> exp_avg, exp_avg_sq;  // host AdamW tensors
  };

  // The AdamW values of one step (host trainers): Start's with the step's
  // adamw_lr, and each group's over them.
  struct AdamWValues {
    kernels::AdamWHyperparameters step;
    std::vector<kernels::AdamWHyperparameters> groups;  // by group index

    const kernels::AdamWHyperparameters& For(const Tensor& t) const {
      return t.group >= 0 && t.group < static_cast<int>(groups.size())
                 ? groups[t.group]
                 : step;
    }
  };

  Impl(const ClientOptions& options, const Device& device,
       std::unique_ptr<v1::Coordinator::Stub> coordinator,
       std::unique_ptr<v1::Worker::Stub> worker);
  // Waits for an async step still in flight.
  ~Impl();

  Tensor* Find(const std::string& name);
  const Tensor* Find(const std::string& name) const;
  // The job matrix `name` of a started CUDA client, for `call`
  // (GradientReady, PlaceGradient), which `host` says a host trainer does
  // instead: the refusals of both, naming the matrix.
  absl::StatusOr<const Tensor*> StartedCudaMatrix(const std::string& name,
                                                  const char* call,
                                                  const char* host) const;
  absl::StatusOr<TensorBuffers> BuffersOf(const Tensor& t) const;
  // The ranks a row-sharded matrix's rows are split over: trainer_count,
  // or the S ranks of this rank's replica group (SetReplicas).
  int ShardCount() const;
  // This rank's rows [begin, end) of a row-sharded matrix of `rows` rows:
  // its shard (trainer_rank % S) of the ShardCount() ranks, as torch.chunk
  // splits them.
  std::pair<int64_t, int64_t> RowRange(int64_t rows) const;
  // This rank's rows of a row_sharded stack (common/row_ranges.h).
  int64_t ShardRows(const Tensor& t) const;
  // FAILED_PRECONDITION naming `field` once started.
  absl::Status CheckNotStarted(const std::string& field,
                               const std::string& what) const;

  // client_attach.cc: the job and the attachment.
  absl::Status EnsureJob(const kernels::MuonHyperparameters& muon,
                         const kernels::AdamWHyperparameters& adamw,
                         std::optional<NsAlgorithm> ns_algorithm);
  absl::Status WaitAndAttach();

  // client_step.cc: the Step RPC, attaching again (once) to a worker that
  // restarted; then the AdamW part (CUDA trainers: also the release of
  // the trainer's stream when the worker cannot do it).
  absl::Status CallStep(const v1::StepRequest& request,
                        v1::StepResponse* response);
  absl::StatusOr<StepResult> StepOnWorker(const v1::StepRequest& request,
                                          const AdamWValues& adamw);

  // client_adamw.cc: the step's AdamW values (`options` checked finite:
  // Start's values with finite lr and weight decay over them stay valid),
  // and the host AdamW step of every AdamW tensor, once per committed
  // step id.
  AdamWValues ResolveAdamW(const StepOptions& options) const;
  absl::Status ApplyAdamW(int64_t step_id, const AdamWValues& adamw,
                          StepResult* result);

  const ClientOptions options;
  const Device device;
  int dedicated_workers = 0;
  int replicas = 0;  // SetReplicas; 0 or 1: none
  bool allow_momentum_reset = false;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  std::unique_ptr<v1::Coordinator::Stub> coordinator;
  std::unique_ptr<v1::Worker::Stub> worker;
  std::vector<Tensor> tensors;
  int64_t matrices = 0;  // of `tensors`, the job matrices (muon)
  std::map<std::string, size_t> index;
  int group_count = 0;  // 1 + the highest group a tensor is in
  std::optional<SharedMemorySegment> segment;
  // Where the step record (lending/step_record.h) sits in the segment:
  // after the tensors.
  int64_t step_record_offset = 0;
  kernels::AdamWHyperparameters adamw;
  kernels::CpuKernels kernels;
  int64_t adamw_steps = 0;
  int64_t last_adamw_step = -1;
  // The highest step id this client sent its worker (-1: none yet). A step
  // the workers committed before this client sent it is not in its
  // parameters (another trainer stepped them): StepOnWorker refuses it.
  int64_t highest_sent_step = -1;
  // ResumeAfter's step, sent with every attempt of the next step until
  // one is answered.
  std::optional<int64_t> resumed_after;
  // PlaceGradient's places for the next Step, by gradient event (the
  // matrix's position among the bound ones).
  std::map<int, v1::CudaBuffer> placed;
  bool started = false;
  // CUDA trainers.
  std::unique_ptr<client_internal::CudaStepSignals> signals;
  std::future<absl::StatusOr<StepResult>> pending;
  // The last step whose BeforeStep was enqueued (-1: none), which
  // WaitForParameters waits on.
  int64_t enqueued_step = -1;
};

}  // namespace muonps

#endif  // MUONPS_CLIENT_CLIENT_IMPL_H_
