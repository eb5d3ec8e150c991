/* muonps C ABI: a stable, C-callable surface over muonps::Client for
 * language bindings (the Python package loads it with ctypes).
 *
 * Handles are opaque. Every call returns a muonps_code (0 on success; the
 * values are the gRPC/absl status codes); after a failure
 * muonps_client_last_error() returns the message naming the field, valid
 * until the next call on the same handle. A handle is used by one thread at
 * a time (muonps_client_gradient_ready excepted). Strings passed in are
 * copied; pointers returned by muonps_client_buffers stay valid until
 * muonps_client_destroy. */
#ifndef MUONPS_CLIENT_MUONPS_C_H_
#define MUONPS_CLIENT_MUONPS_C_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MUONPS_C_ABI_VERSION 13

/* Parameter groups are numbered [0, MUONPS_MAX_GROUPS). */
#define MUONPS_MAX_GROUPS 1024

typedef enum {
  MUONPS_OK = 0,
  MUONPS_CANCELLED = 1,
  MUONPS_UNKNOWN = 2,
  MUONPS_INVALID_ARGUMENT = 3,
  MUONPS_DEADLINE_EXCEEDED = 4,
  MUONPS_NOT_FOUND = 5,
  MUONPS_ALREADY_EXISTS = 6,
  MUONPS_PERMISSION_DENIED = 7,
  MUONPS_RESOURCE_EXHAUSTED = 8,
  MUONPS_FAILED_PRECONDITION = 9,
  MUONPS_ABORTED = 10,
  MUONPS_OUT_OF_RANGE = 11,
  MUONPS_UNIMPLEMENTED = 12,
  MUONPS_INTERNAL = 13,
  MUONPS_UNAVAILABLE = 14,
  MUONPS_DATA_LOSS = 15,
} muonps_code;

/* Layouts, as muonps.v1.Layout. ABI 13: MUONPS_LAYOUT_ROW_SHARDED_EXPERTS
 * is row_sharded with the stack's experts split whole over the ranks
 * (muonps.v1.Matrix.shard_experts; a matrix's layout only). */
enum {
  MUONPS_LAYOUT_REPLICATED = 1,
  MUONPS_LAYOUT_UNREDUCED = 2,
  MUONPS_LAYOUT_ROW_SHARDED = 3,
  MUONPS_LAYOUT_ROW_SHARDED_EXPERTS = 4,
};

/* LR adjustments, as muonps.v1.LrAdjustment. */
enum {
  MUONPS_ADJUST_LR_ORIGINAL = 1,
  MUONPS_ADJUST_LR_MATCH_RMS_ADAMW = 2,
};

typedef struct muonps_client muonps_client;

/* Newton-Schulz variants, as muonps.v1.NsAlgorithm. */
enum {
  MUONPS_NS_AUTO = 0, /* the plan picks per shape */
  MUONPS_NS_NS5 = 1,
  MUONPS_NS_GRAM = 2,
};

/* torch.optim.Muon's arguments; zero-initialize, then set. */
typedef struct {
  double lr;
  double weight_decay;
  double momentum;           /* taken as given: 0 means no momentum */
  int nesterov;              /* 0 or 1 */
  int ns_steps;              /* 0: 5 */
  int adjust_lr_fn;          /* MUONPS_ADJUST_LR_* */
  int ns_algorithm;          /* MUONPS_NS_* */
  int polar_express;         /* 1: Polar Express coefficients per iteration */
  double ns_eps;             /* 0: 1e-7 */
  double ns_coefficients[3]; /* (a, b, c); all 0: torch's defaults */
} muonps_muon_hyper;

typedef struct {
  double lr;
  double beta1;
  double beta2;
  double eps;
  double weight_decay;
} muonps_adamw_hyper;

typedef struct {
  int pending; /* an async step was enqueued; muonps_client_wait ends it */
  int already_applied; /* committed before (a retry settled it, say) */
  double seconds;
  int64_t bytes_moved;
  int64_t momentum_reset;
  int64_t plan_version;
  /* ABI 5: this call stepped the AdamW tensors (host trainers): once per
   * committed step id, on its first answer, fresh or already applied. */
  int adamw_applied;
  /* ABI 7: with already_applied, this trainer resumed after the step before
   * (muonps_client_resume_after) and its worker repaired its parameters to
   * hold the step from a peer's trainer. */
  int repaired;
} muonps_step_result;

/* "muonps X.Y.Z (C ABI N)"; static storage. */
const char* muonps_version(void);
int muonps_abi_version(void);

/* Creates a client; *out is NULL on failure (the message is then in
 * muonps_last_create_error()). */
int muonps_client_create(const char* coordinator, const char* job,
                         const char* worker_socket, int trainer_rank,
                         int trainer_count, double timeout_seconds,
                         muonps_client** out);
const char* muonps_last_create_error(void);
void muonps_client_destroy(muonps_client* client);
const char* muonps_client_last_error(const muonps_client* client);

int muonps_client_add_matrix(muonps_client* client, const char* name,
                             int64_t rows, int64_t cols, int64_t experts,
                             int layout, int layer);
int muonps_client_add_tensor(muonps_client* client, const char* name,
                             int64_t elements, int layout);
int muonps_client_start(muonps_client* client, const muonps_muon_hyper* muon,
                        const muonps_adamw_hyper* adamw);
/* param, grad: fp32 buffers of `*elements` floats (this rank's rows of a
 * row_sharded matrix: [*row_begin, *row_end) of each expert; of a stack
 * added with MUONPS_LAYOUT_ROW_SHARDED_EXPERTS, its whole experts, as
 * torch.chunk splits them, with *row_begin 0 and *row_end the rows). */
int muonps_client_buffers(const muonps_client* client, const char* name,
                          float** param, float** grad, int64_t* elements,
                          int64_t* row_begin, int64_t* row_end);
/* muonps_client_step_with with no groups, stream or async: lr,
 * weight_decay, adamw_lr < 0 keep the defaults. A step is atomic on the
 * workers; after a failure retry the same step_id until it succeeds:
 * nothing (Muon or AdamW) is applied twice. */
int muonps_client_step(muonps_client* client, int64_t step_id, double lr,
                       double weight_decay, double adamw_lr,
                       muonps_step_result* result);

/* Momentum of expert `expert` of matrix `name`, `count` = rows * cols
 * floats, if the local worker owns it (MUONPS_NOT_FOUND otherwise). */
int muonps_client_get_momentum(muonps_client* client, const char* name,
                               int64_t expert, float* out, int64_t count);
int muonps_client_set_momentum(muonps_client* client, const char* name,
                               int64_t expert, const float* values,
                               int64_t count);
/* AdamW state of a tensor: moments (elements floats each) and the step
 * count shared by all AdamW tensors. */
int muonps_client_get_adamw(muonps_client* client, const char* name,
                            float* exp_avg, float* exp_avg_sq, int64_t elements,
                            int64_t* steps);
int muonps_client_set_adamw(muonps_client* client, const char* name,
                            const float* exp_avg, const float* exp_avg_sq,
                            int64_t elements, int64_t steps);
/* ABI 5: the last step id whose AdamW part the client's state includes
 * (-1: none; restoring a checkpoint taken before step N sets N - 1): a step
 * at or below it is not stepped by AdamW again. */
int muonps_client_set_last_adamw_step(muonps_client* client, int64_t step_id);
/* ABI 7: a trainer restarted from its own state saved after step `step_id`
 * (-1: the initial parameters) says so before its first step
 * (Client::ResumeAfter): a step its worker committed after that save is
 * repaired into the parameters, or refused with DATA_LOSS naming the state
 * to reload. Sets the last AdamW step to `step_id`. */
int muonps_client_resume_after(muonps_client* client, int64_t step_id);

/* ABI 3: GPU trainers, parameter groups, steps that return once enqueued
 * (ABI 4: muonps_client_lend_cuda takes the buffers' dtype, fp32 or bf16).
 *
 * muonps_client_create_on: as muonps_client_create, with the device the
 * trainer's buffers live on: "cpu" (a shared segment, muonps_client_buffers)
 * or "cuda:N" (the trainer's own CUDA buffers, muonps_client_lend_cuda; the
 * local worker must run on that GPU). */
int muonps_client_create_on(const char* coordinator, const char* job,
                            const char* worker_socket, int trainer_rank,
                            int trainer_count, double timeout_seconds,
                            const char* device, muonps_client** out);
/* CUDA trainers, before start: a declared matrix's gradient and parameter
 * (device pointers of the element counts muonps_client_buffers would
 * report, both of `dtype`: "fp32" (also NULL) or "bf16"), kept allocated
 * and in place while attached. */
int muonps_client_lend_cuda(muonps_client* client, const char* name,
                            uint64_t grad_ptr, uint64_t param_ptr,
                            const char* dtype);
/* ABI 8: CUDA trainers, after start: the gradient of matrix `name` (lent
 * with muonps_client_lend_cuda) is final for the next step once `stream`
 * (a cudaStream_t; NULL: the legacy default stream) gets here
 * (Client::GradientReady). Records that matrix's own event on `stream` and
 * returns once it is enqueued, so the worker starts on it while backward
 * still runs; call it again after any later write of the gradient before
 * the step. A step records, on its own stream, the event of every matrix
 * not marked ready since the previous step, so a trainer that never calls
 * this stays correct. While the worker has yet to answer an async step,
 * first waits for that answer. Unlike the other calls it may run on
 * another thread while one of them runs (PyTorch's gradient hooks run on
 * its autograd thread); it sets the handle's last error only when it
 * fails. MUONPS_FAILED_PRECONDITION for a "cpu" client,
 * MUONPS_NOT_FOUND naming `name` unless it is a declared matrix (AdamW
 * tensors have no event), MUONPS_INVALID_ARGUMENT before start. */
int muonps_client_gradient_ready(muonps_client* client, const char* name,
                                 void* stream);
/* Before start: the job expects `count` workers with no trainer
 * (muonps-worker --dedicated); start waits for a plan that has them. */
int muonps_client_expect_dedicated_workers(muonps_client* client, int count);
/* ABI 9: before start and before any row-sharded matrix is added: HSDP
 * (a 2-D device mesh, replicate x shard; JobSpec.replicas). The trainers
 * form `replicas` replica groups of S = trainer_count / replicas ranks
 * each, ranks r*S .. r*S+S-1 (row-major); a row-sharded matrix's rows are
 * split over the S ranks of a group, this rank holding those of shard
 * trainer_rank % S (muonps_client_buffers' row range), and every group
 * holds the same gradients. 0 or 1 (the default): none. The same on every
 * rank. MUONPS_INVALID_ARGUMENT naming `replicas` below 0 or not dividing
 * trainer_count; MUONPS_FAILED_PRECONDITION after start or once a
 * row-sharded matrix is added. */
int muonps_client_set_replicas(muonps_client* client, int replicas);
/* Before start: `allow` nonzero lets a matrix whose owner left (its
 * momentum in no checkpoint) start again from zero momentum, counted in
 * muonps_step_result.momentum_reset; 0 (the default) fails such a step
 * with MUONPS_FAILED_PRECONDITION naming the matrix. */
int muonps_client_allow_momentum_reset(muonps_client* client, int allow);
/* Before start: the workers checkpoint the momentum they own into `dir`
 * (absolute) after every step whose id is a multiple of `every` (0: only
 * when muonps_client_checkpoint asks), and restore missing momentum from
 * there (JobSpec.checkpoint_dir, checkpoint_every). */
int muonps_client_set_checkpointing(muonps_client* client, const char* dir,
                                    int64_t every);
/* Asks the local worker for a checkpoint after the next step it commits;
 * *last_step: the last step it checkpointed (-1: none). */
int muonps_client_checkpoint(muonps_client* client, int64_t* last_step);
/* *step: the last step the local worker checkpointed (-1: none). */
int muonps_client_last_checkpoint_step(muonps_client* client, int64_t* step);
/* The local worker replaces the momentum it owns with checkpoint `step` of
 * `dir`; *restored: how many experts. */
int muonps_client_restore_checkpoint(muonps_client* client, const char* dir,
                                     int64_t step, int64_t* restored);
/* Before start: puts `count` declared tensors, Muon matrices and AdamW
 * tensors alike, in parameter group `group` (0 <= group <
 * MUONPS_MAX_GROUPS), registered with the local worker when start attaches
 * them; each step's group_*[group] values then apply to them, and tensors
 * in no group take the step's own. ABI 6: AdamW tensors too, and every
 * name is checked here (all or nothing): MUONPS_INVALID_ARGUMENT naming
 * `group` out of range, or `names[i]` undeclared or already in a group. */
int muonps_client_set_group(muonps_client* client, int group,
                            const char* const* names, int count);

/* One step's values. Each group_* array holds group_count values, one per
 * group index (NULL: every group keeps the step's own for that field); a
 * value < 0 keeps the step's own (lr, weight_decay, adamw_lr here, start's
 * AdamW weight decay). group_count 0: every tensor takes the step's own;
 * otherwise at least 1 + the highest group set, and at most
 * MUONPS_MAX_GROUPS. Every value must be finite (MUONPS_INVALID_ARGUMENT
 * naming it, e.g. "groups[1].adamw_lr", before anything is sent). */
typedef struct {
  double lr;           /* < 0: the job's default */
  double weight_decay; /* < 0: the job's default */
  double adamw_lr;     /* < 0: start's */
  int group_count;
  const double* group_lr;           /* Muon lr of the group's matrices */
  const double* group_weight_decay; /* Muon weight decay */
  uint64_t stream; /* CUDA trainers: the gradients' cudaStream_t (0: legacy) */
  /* CUDA trainers: 1 returns once enqueued, the stream waiting on the
   * device for the step's updates; ABI 10: 2 returns once enqueued and the
   * stream waits only where muonps_client_wait_for_parameters says
   * (StepOptions::forward_waits). */
  int async;
  /* ABI 6: AdamW lr and weight decay of the group's other tensors (host
   * trainers: the client steps them with these; CUDA trainers step their
   * own and pass what they used, which the workers check agrees). */
  const double* group_adamw_lr;
  const double* group_adamw_weight_decay;
} muonps_step_options;

int muonps_client_step_with(muonps_client* client, int64_t step_id,
                            const muonps_step_options* options,
                            muonps_step_result* result);
/* The result of the step an async step enqueued (pending = 0 after). */
int muonps_client_wait(muonps_client* client, muonps_step_result* result);
/* ABI 10: CUDA trainers whose steps return with async = 2: makes `stream`
 * (a cudaStream_t; NULL: the legacy default stream) wait, on the device,
 * until the last step enqueued has written the parameters of the first
 * `matrices` declared matrices (declaration order), or all it will (-1:
 * the whole step; 0: the gradients are free to write and the AdamW means
 * are in place) (Client::WaitForParameters). Returns once enqueued. */
int muonps_client_wait_for_parameters(muonps_client* client, void* stream,
                                      int64_t matrices);
/* ABI 11: CUDA trainers, after start, for the next step only: the
 * gradient of matrix `name` lies at `grad_ptr` (device memory of the
 * client's GPU, as many values of the lent dtype as its lent buffer), and
 * the worker reads it there instead of the lent buffer
 * (Client::PlaceGradient). Keep it allocated and unwritten until the step
 * is done; a step with async = 2 refuses placed gradients.
 * MUONPS_FAILED_PRECONDITION for a "cpu" client, MUONPS_NOT_FOUND naming
 * `name` unless it is a declared matrix, MUONPS_INVALID_ARGUMENT for
 * memory that cannot be lent. */
int muonps_client_place_gradient(muonps_client* client, const char* name,
                                 uint64_t grad_ptr);
/* ABI 12: CUDA trainers, after start: zeroed device memory of the client's
 * GPU for matrix `name`'s gradient (as many values of its lent dtype), from
 * cudaMalloc, which muonps_client_place_gradient always takes whatever
 * allocator the trainer uses (Client::AllocateGradient): *out is its
 * device pointer. The caller owns it: free it with muonps_free_cuda_memory
 * once no step reads it (the client may be gone by then). Errors as
 * muonps_client_place_gradient's; MUONPS_RESOURCE_EXHAUSTED when the GPU
 * is full. */
int muonps_client_allocate_gradient(muonps_client* client, const char* name,
                                    uint64_t* out);
/* ABI 12: frees memory muonps_client_allocate_gradient returned (0:
 * nothing). MUONPS_INVALID_ARGUMENT for a pointer CUDA does not know. */
int muonps_free_cuda_memory(uint64_t ptr);

#ifdef __cplusplus
}
#endif

#endif /* MUONPS_CLIENT_MUONPS_C_H_ */
