// What worker_rpc_fuzzer runs against, shared with the seed generator: the
// job every input's engine serves (small matrices of every layout, a stack
// of experts), its worker id, and the shared-memory segment size the
// harness lends (fuzzed requests bind tensors anywhere inside it), plus the
// record tags. Header-only.
#ifndef MUONPS_FUZZ_WORKER_FIXTURE_H_
#define MUONPS_FUZZ_WORKER_FIXTURE_H_

#include <cstdint>

#include "muonps/v1/coordinator.pb.h"

namespace muonps {
namespace fuzz {

// Which call a worker_rpc_fuzzer record makes (its tag, modulo the count).
enum class WorkerCall : uint8_t {
  kSetPlan = 0,  // payload: a v1::Plan for FuzzWorkerJob()
  kAttach,       // v1::AttachRequest
  kStep,         // v1::StepRequest
  kGetMomentum,  // v1::GetMomentumRequest
  kSetMomentum,  // v1::SetMomentumRequest
  kReleaseTrainerIfGone,
  kFollowStep,
};
constexpr int kWorkerCallCount = 7;

constexpr char kFuzzWorkerId[] = "w0";
constexpr int64_t kFuzzSegmentBytes = 64 << 10;

inline v1::JobSpec FuzzWorkerJob() {
  v1::JobSpec job;
  job.set_name("fuzz");
  struct Decl {
    const char* name;
    int64_t rows, cols, experts;
    v1::Layout layout;
  };
  const Decl decls[] = {
      {"w.a", 8, 8, 1, v1::LAYOUT_REPLICATED},
      {"w.b", 8, 8, 1, v1::LAYOUT_REPLICATED},
      {"w.c", 6, 10, 1, v1::LAYOUT_ROW_SHARDED},
      {"w.e", 4, 4, 3, v1::LAYOUT_UNREDUCED},
  };
  for (const Decl& d : decls) {
    v1::Matrix* m = job.add_matrices();
    m->set_name(d.name);
    m->set_rows(d.rows);
    m->set_cols(d.cols);
    m->set_experts(d.experts);
    m->set_layout(d.layout);
  }
  job.mutable_muon()->set_lr(0.02);
  return job;
}

}  // namespace fuzz
}  // namespace muonps

#endif  // MUONPS_FUZZ_WORKER_FIXTURE_H_
