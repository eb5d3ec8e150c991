// bench/step_host: what a worker's step costs the host per matrix as the
// job grows to 10^4 matrices in 100 parameter groups. One CPU worker
// (StepEngine over a one-rank TCP transport) steps jobs of 4 x 4 matrices,
// each group's values given by index (wire.h's StepRequestFromProto), and
// the same matrices run through the CPU kernels in one process. Prints one
// JSON line per job size: the step's ms and us per matrix, the ratio of
// the step to the kernels alone, the per-matrix cost against the smallest
// job's (flat: no per-matrix work grows with the job, such as matching
// names), and the wire request's bytes.
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "kernels/cpu/cpu_kernels.h"
#include "muonps/v1/worker.pb.h"
#include "scheduler/planner.h"
#include "server/worker/step_engine.h"
#include "server/worker/wire.h"
#include "spdlog/spdlog.h"
#include "transport/tcp_transport.h"

ABSL_FLAG(std::string, matrices, "100,1000,10000", "Job sizes (matrices).");
ABSL_FLAG(int, groups, 100, "Parameter groups the matrices are spread over.");
ABSL_FLAG(int, dim, 4, "Each matrix is dim x dim.");
ABSL_FLAG(int, steps, 5, "Timed steps per job (after one untimed).");

namespace muonps {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start)
      .count();
}

// The trainer's buffers in this process's memory, by tensor name.
class HostBuffers final : public worker::TrainerBuffers {
 public:
  explicit HostBuffers(std::map<std::string, worker::LentTensor> tensors)
      : tensors_(std::move(tensors)) {}
  Device device() const override { return kHostDevice; }
  absl::StatusOr<worker::LentTensor> Map(const worker::TensorBinding& t,
                                         int64_t, int64_t) override {
    auto it = tensors_.find(t.name);
    if (it == tensors_.end()) return absl::NotFoundError(t.name);
    return it->second;
  }

 private:
  std::map<std::string, worker::LentTensor> tensors_;
};

struct JobResult {
  double step_ms = 0;
  double kernels_ms = 0;
  int64_t request_bytes = 0;
};

absl::StatusOr<JobResult> RunJob(int count, int groups, int dim, int steps) {
  const int64_t size = int64_t{dim} * dim;
  worker::JobPlan plan;
  plan.job.name = "step-host";
  plan.job.muon = kernels::MuonHyperparameters{};
  plan.job.muon.lr = 0.02;
  for (int m = 0; m < count; ++m) {
    scheduler::MatrixSpec spec;
    spec.name = absl::StrCat("layers.", m / 7, ".block.", m, ".weight");
    spec.rows = dim;
    spec.cols = dim;
    spec.layer = m / 7;
    plan.job.matrices.push_back(spec);
  }
  scheduler::PlanInput input;
  input.matrices = plan.job.matrices;
  input.workers.push_back({.id = "w0"});
  MUONPS_ASSIGN_OR_RETURN(plan.ownership, scheduler::PlanOwnership(input));
  plan.membership = {1, {"w0"}, "bench"};

  std::vector<std::vector<float>> grad(count, std::vector<float>(size)),
      param(count, std::vector<float>(size, 0.5f));
  std::map<std::string, worker::LentTensor> lent;
  v1::AttachRequest attach;
  attach.set_trainer_rank(0);
  attach.set_trainer_count(1);
  for (int m = 0; m < count; ++m) {
    for (int64_t i = 0; i < size; ++i) grad[m][i] = 0.01f * ((m + i) % 17);
    lent[plan.job.matrices[m].name] = {grad[m].data(), param[m].data()};
    v1::TensorBinding* b = attach.add_tensors();
    b->set_name(plan.job.matrices[m].name);
    b->set_muon(true);
    b->set_elements(size);
    b->set_group(1 + m % groups);
  }
  MUONPS_ASSIGN_OR_RETURN(std::unique_ptr<transport::TcpListener> bound,
                          transport::TcpListener::Bind("127.0.0.1", 0));
  transport::TcpListener* listener = bound.get();
  worker::StepBackend backend = worker::CpuStepBackend(absl::Seconds(30));
  backend.open_buffers = [&lent](const worker::AttachRequest&)
      -> absl::StatusOr<std::unique_ptr<worker::TrainerBuffers>> {
    return std::unique_ptr<worker::TrainerBuffers>(new HostBuffers(lent));
  };
  worker::StepEngine engine(
      "w0", std::move(backend),
      [listener](int rank, const std::vector<std::string>& peers,
                 uint64_t session, const std::string& secret)
          -> absl::StatusOr<std::unique_ptr<transport::Transport>> {
        transport::TcpOptions options;
        options.data_plane_secret = secret;
        MUONPS_ASSIGN_OR_RETURN(std::unique_ptr<transport::TcpTransport> t,
                                transport::TcpTransport::Connect(
                                    listener, rank, peers, session, options));
        return std::unique_ptr<transport::Transport>(std::move(t));
      });
  engine.SetDataPlaneSecret("step_host bench's data-plane secret");
  MUONPS_RETURN_IF_ERROR(engine.SetPlan(plan, {{"w0", listener->address()}}));
  MUONPS_ASSIGN_OR_RETURN(const worker::AttachRequest request,
                          worker::AttachRequestFromProto(attach));
  MUONPS_RETURN_IF_ERROR(engine.Attach(request).status());

  JobResult result;
  for (int s = 0; s <= steps; ++s) {
    v1::StepRequest step;
    step.set_step_id(s);
    step.set_lr(-1);
    step.set_weight_decay(-1);
    step.set_adamw_lr(-1);
    for (int g = 0; g < groups; ++g) {
      v1::GroupHyperparameters* values = step.add_groups();
      values->set_lr(0.02 / (1 + g % 3));
      values->set_weight_decay(0.01);
      values->set_adamw_lr(-1);
      values->set_adamw_weight_decay(-1);
    }
    result.request_bytes = static_cast<int64_t>(step.ByteSizeLong());
    const Clock::time_point start = Clock::now();
    MUONPS_RETURN_IF_ERROR(
        engine.Step(worker::StepRequestFromProto(step)).status());
    if (s > 0) result.step_ms += MsSince(start) / steps;
  }

  // The same matrices through the kernels in one process: momentum and
  // Newton-Schulz of one same-shape stack, as the worker batches them.
  kernels::CpuKernels cpu(kernels::CpuKernelOptions{});
  std::vector<float> g(count * size, 0.01f), buf(count * size),
      out(count * size);
  const kernels::MatrixStack grads{g.data(), count, dim, dim};
  const kernels::MatrixStack momentum{buf.data(), count, dim, dim};
  const kernels::MatrixStack update{out.data(), count, dim, dim};
  for (int s = 0; s <= steps; ++s) {
    const Clock::time_point start = Clock::now();
    MUONPS_RETURN_IF_ERROR(cpu.UpdateMomentum(grads, momentum, momentum, 0.95,
                                              true, update, kHostStream));
    MUONPS_RETURN_IF_ERROR(
        cpu.Orthogonalize(update, update, plan.job.muon.ns, kHostStream));
    if (s > 0) result.kernels_ms += MsSince(start) / steps;
  }
  return result;
}

}  // namespace
}  // namespace muonps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  spdlog::set_level(spdlog::level::warn);
  const int groups = absl::GetFlag(FLAGS_groups);
  double first_us = -1;
  for (const absl::string_view n :
       absl::StrSplit(absl::GetFlag(FLAGS_matrices), ',')) {
    int count = 0;
    if (!absl::SimpleAtoi(n, &count) || count < 1) {
      std::fprintf(stderr, "--matrices: %s is not a count\n",
                   std::string(n).c_str());
      return 2;
    }
    absl::StatusOr<muonps::JobResult> r = muonps::RunJob(
        count, groups, absl::GetFlag(FLAGS_dim), absl::GetFlag(FLAGS_steps));
    if (!r.ok()) {
      std::fprintf(stderr, "%d matrices: %s\n", count,
                   r.status().ToString().c_str());
      return 1;
    }
    const double us = 1e3 * r->step_ms / count;
    if (first_us < 0) first_us = us;
    std::printf(
        "{\"what\":\"step_host_per_matrix\",\"backend\":\"cpu\",\"workers\":1,"
        "\"matrices\":%d,\"groups\":%d,\"dim\":%d,\"step_ms\":%.3f,"
        "\"us_per_matrix\":%.3f,\"kernels_ms\":%.3f,\"x_kernels\":%.2f,"
        "\"x_first_per_matrix\":%.2f,\"request_bytes\":%lld}\n",
        count, groups, absl::GetFlag(FLAGS_dim), r->step_ms, us, r->kernels_ms,
        r->step_ms / r->kernels_ms, us / first_us,
        static_cast<long long>(r->request_bytes));
    std::fflush(stdout);
  }
  return 0;
}
