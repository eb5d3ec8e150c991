// mlp_trainer: one trainer rank of the example. It trains a student MLP to
// imitate a fixed random teacher, with its weight matrices optimized by
// Muon on the muonps workers and its biases by AdamW in the client, ranks
// splitting the batch (unreduced) or each holding the whole gradient
// (replicated, row_sharded). Rank 0 prints one JSON line per step
// {"step","loss","step_ms"} and, at the end, {"initial_loss","final_loss",
// "steps","layout","parity_max_rel_err"}: its final parameters against a
// single-process run of the same kernels. A failed step is retried as a
// training loop does: while the error says a retry can succeed (UNAVAILABLE,
// DEADLINE_EXCEEDED, ABORTED: a worker restarting, a re-plan, a peer
// frozen) for up to --step_retry_s, with backoff; other errors end the run.
// With --state_file, every answered step's state (parameters, AdamW
// moments) is saved there durably, and a trainer started again (after a
// kill -9 at any moment) resumes from it as a user's loop does
// (Client::ResumeAfter): a step its worker committed after the save is
// repaired from a peer's trainer, so the run ends as if never stopped.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "common/status.h"
#include "examples/trainer/trainer_state.h"
#include "examples/trainer/training.h"
#include "nlohmann/json.hpp"
#include "tests/client_options.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:7070", "Coordinator HOST:PORT.");
ABSL_FLAG(std::string, job, "mlp", "Job name.");
ABSL_FLAG(std::string, worker_socket, "", "The local worker's Unix socket.");
ABSL_FLAG(int, rank, 0, "This trainer's rank.");
ABSL_FLAG(int, ranks, 1, "Number of trainer ranks.");
ABSL_FLAG(std::string, layout, "unreduced",
          "replicated|unreduced|row_sharded.");
ABSL_FLAG(int, steps, 30, "Optimizer steps.");
ABSL_FLAG(std::string, widths, "64,256,256,16", "MLP widths, input first.");
ABSL_FLAG(int64_t, batch, 256, "Global batch size.");
ABSL_FLAG(double, lr, 0.02, "Muon learning rate.");
ABSL_FLAG(double, weight_decay, 0.01, "Muon weight decay.");
ABSL_FLAG(double, adamw_lr, 1e-3, "AdamW learning rate (biases).");
ABSL_FLAG(std::string, params_out, "", "Write the final parameters here.");
ABSL_FLAG(bool, parity, true, "Rank 0 checks against a single-process run.");
ABSL_FLAG(int, dedicated_workers, 0,
          "Workers with no trainer (muonps-worker --dedicated) to wait for.");
ABSL_FLAG(double, step_retry_s, 120,
          "How long a step is retried while its error is transient.");
ABSL_FLAG(std::string, state_file, "",
          "Save this rank's state here after every step, and resume from it "
          "when it exists.");

namespace muonps {
namespace example {
namespace {

// Step(step) until it is answered, retrying transient errors (the service
// applies a step id once, whatever the retries: client.h) for up to
// --step_retry_s with backoff. *retries counts the failed attempts.
absl::StatusOr<StepResult> StepWithRetries(Client& client, int64_t step,
                                           int rank, int64_t* retries) {
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::duration<double>(absl::GetFlag(FLAGS_step_retry_s));
  std::chrono::duration<double> backoff(0.1);
  for (;;) {
    absl::StatusOr<StepResult> result = client.Step(step);
    if (result.ok()) return result;
    const absl::Status& s = result.status();
    const bool transient = absl::IsUnavailable(s) ||
                           absl::IsDeadlineExceeded(s) || absl::IsAborted(s);
    if (!transient || std::chrono::steady_clock::now() + backoff > deadline) {
      return s;
    }
    ++*retries;
    std::fprintf(stderr, "rank %d: step %lld failed, retrying in %.1f s: %s\n",
                 rank, static_cast<long long>(step), backoff.count(),
                 s.ToString().c_str());
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::duration<double>(2.0));
  }
}

absl::StatusOr<TrainConfig> ConfigFromFlags() {
  TrainConfig config;
  for (absl::string_view w : absl::StrSplit(absl::GetFlag(FLAGS_widths), ',')) {
    int64_t width = 0;
    if (!absl::SimpleAtoi(w, &width)) {
      return InvalidField("widths", "must be comma-separated integers");
    }
    config.shape.widths.push_back(width);
  }
  config.batch = absl::GetFlag(FLAGS_batch);
  config.steps = absl::GetFlag(FLAGS_steps);
  config.ranks = absl::GetFlag(FLAGS_ranks);
  const std::string layout = absl::GetFlag(FLAGS_layout);
  if (layout == "replicated") {
    config.layout = scheduler::Layout::kReplicated;
  } else if (layout == "unreduced") {
    config.layout = scheduler::Layout::kUnreduced;
  } else if (layout == "row_sharded") {
    config.layout = scheduler::Layout::kRowSharded;
  } else {
    return InvalidField("layout", "is not replicated, unreduced, row_sharded");
  }
  config.muon.lr = absl::GetFlag(FLAGS_lr);
  config.muon.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  config.muon.lr_adjustment = kernels::LrAdjustment::kMatchRmsAdamW;
  config.adamw.lr = absl::GetFlag(FLAGS_adamw_lr);
  config.adamw.weight_decay = 0.0;
  return config;
}

absl::Status Run() {
  MUONPS_ASSIGN_OR_RETURN(const TrainConfig config, ConfigFromFlags());
  const int rank = absl::GetFlag(FLAGS_rank);
  MUONPS_ASSIGN_OR_RETURN(TeacherTask task,
                          TeacherTask::Create({.shape = config.shape}));
  MUONPS_ASSIGN_OR_RETURN(Mlp model, Mlp::Create(config.shape));
  model.Init(config.seed, 1.0f);

  MUONPS_ASSIGN_OR_RETURN(
      std::unique_ptr<Client> client,
      Client::Create({.coordinator = absl::GetFlag(FLAGS_coordinator),
                      .job = absl::GetFlag(FLAGS_job),
                      .worker_socket = absl::GetFlag(FLAGS_worker_socket),
                      .trainer_rank = rank,
                      .trainer_count = config.ranks}));
  MUONPS_RETURN_IF_ERROR(
      client->ExpectDedicatedWorkers(absl::GetFlag(FLAGS_dedicated_workers)));
  for (const MlpParameter& p : model.parameters()) {
    if (p.is_matrix) {
      MUONPS_RETURN_IF_ERROR(client->AddMatrix(
          p.name, p.shape[0], p.shape[1],
          {.layout = testing::ClientLayout(config.layout),
           .layer = static_cast<int32_t>(&p - &model.parameters()[0]) / 2,
           .shard_params = false}));
    } else {
      MUONPS_RETURN_IF_ERROR(
          client->AddTensor(p.name, p.num_elements,
                            config.layout == scheduler::Layout::kUnreduced
                                ? TensorLayout::kUnreduced
                                : TensorLayout::kReplicated));
    }
  }
  // The config as the client takes it; the reference run takes the
  // kernels' own (training.h).
  MUONPS_RETURN_IF_ERROR(client->Start(testing::ClientMuon(config.muon),
                                       testing::ClientAdamW(config.adamw)));
  // A rank started again resumes from its last saved state.
  const std::string state_file = absl::GetFlag(FLAGS_state_file);
  TrainerState state;
  MUONPS_ASSIGN_OR_RETURN(
      std::optional<TrainerState> saved,
      state_file.empty()
          ? absl::StatusOr<std::optional<TrainerState>>(std::nullopt)
          : LoadTrainerState(state_file));
  // The AdamW tensors (the biases), whose moments the client holds.
  std::vector<const MlpParameter*> adamw;
  for (const MlpParameter& p : model.parameters()) {
    if (!p.is_matrix) adamw.push_back(&p);
  }
  const bool resumed = saved.has_value();
  if (resumed) {
    state = *std::move(saved);
    if (static_cast<int64_t>(state.params.size()) != model.block_floats() ||
        state.exp_avg.size() != adamw.size()) {
      return InvalidField("state_file",
                          absl::StrCat(state_file, " holds another model"));
    }
    std::memcpy(model.params_data(), state.params.data(),
                state.params.size() * sizeof(float));
    for (size_t i = 0; i < adamw.size(); ++i) {
      MUONPS_RETURN_IF_ERROR(client->RestoreAdamW(
          adamw[i]->name, state.exp_avg[i], state.exp_avg_sq[i]));
    }
    client->set_adamw_steps(state.adamw_steps);
    MUONPS_RETURN_IF_ERROR(client->ResumeAfter(state.step));
    ++state.resumes;
    std::fprintf(stderr, "rank %d: resumed from %s after step %lld\n", rank,
                 state_file.c_str(), static_cast<long long>(state.step));
  }
  // The client's buffers are what the workers update: copy the initial
  // parameters in, then move gradients in and parameters out every step.
  std::vector<TensorBuffers> buffers;
  for (const MlpParameter& p : model.parameters()) {
    MUONPS_ASSIGN_OR_RETURN(TensorBuffers b, client->Buffers(p.name));
    std::memcpy(b.param, model.params_data() + p.offset,
                b.param_elements * sizeof(float));
    buffers.push_back(b);
  }
  if (!resumed) {
    MUONPS_ASSIGN_OR_RETURN(state.initial_loss,
                            BatchLoss(config, &task, &model, 0));
  }
  const double initial_loss = state.initial_loss;
  // The loss of the parameters as they are (after the saved step).
  MUONPS_ASSIGN_OR_RETURN(
      double loss, resumed ? BatchLoss(config, &task, &model, state.step + 1)
                           : absl::StatusOr<double>(initial_loss));
  int64_t& retries = state.retries;
  int64_t resets = 0;
  for (int step = static_cast<int>(state.step + 1); step < config.steps;
       ++step) {
    const auto start = std::chrono::steady_clock::now();
    MUONPS_RETURN_IF_ERROR(
        ComputeGradient(config, &task, &model, step, rank).status());
    for (size_t i = 0; i < buffers.size(); ++i) {
      const MlpParameter& p = model.parameters()[i];
      const TensorBuffers& b = buffers[i];
      // A row_sharded matrix lends only this rank's rows of its gradient.
      const int64_t first = b.row_begin * (p.is_matrix ? p.shape[1] : 0);
      std::memcpy(b.grad, model.grads_data() + p.offset + first,
                  b.elements * sizeof(float));
    }
    MUONPS_ASSIGN_OR_RETURN(const StepResult result,
                            StepWithRetries(*client, step, rank, &retries));
    resets += result.momentum_reset;
    for (size_t i = 0; i < buffers.size(); ++i) {
      std::memcpy(model.params_data() + model.parameters()[i].offset,
                  buffers[i].param, buffers[i].param_elements * sizeof(float));
    }
    const double step_ms = std::chrono::duration<double, std::milli>(
                               std::chrono::steady_clock::now() - start)
                               .count();
    if (!state_file.empty()) {
      state.step = step;
      state.adamw_steps = client->adamw_steps();
      state.params.assign(model.params_data(),
                          model.params_data() + model.block_floats());
      state.exp_avg.resize(adamw.size());
      state.exp_avg_sq.resize(adamw.size());
      for (size_t i = 0; i < adamw.size(); ++i) {
        MUONPS_ASSIGN_OR_RETURN(auto moments,
                                client->AdamWState(adamw[i]->name));
        const int64_t n = adamw[i]->num_elements;
        state.exp_avg[i].assign(moments.first, moments.first + n);
        state.exp_avg_sq[i].assign(moments.second, moments.second + n);
      }
      MUONPS_RETURN_IF_ERROR(SaveTrainerState(state_file, state));
    }
    MUONPS_ASSIGN_OR_RETURN(loss, BatchLoss(config, &task, &model, step + 1));
    if (rank == 0) {
      nlohmann::ordered_json line;
      line["step"] = step;
      line["loss"] = loss;
      line["step_ms"] = step_ms;
      line["bytes_moved"] = result.bytes_moved;
      line["plan_version"] = result.plan_version;
      std::printf("%s\n", line.dump().c_str());
      std::fflush(stdout);
    }
  }
  const std::string out = absl::GetFlag(FLAGS_params_out);
  if (!out.empty()) {
    std::ofstream file(out, std::ios::binary);
    file.write(reinterpret_cast<const char*>(model.params_data()),
               model.block_floats() * sizeof(float));
  }
  if (rank != 0) return absl::OkStatus();
  nlohmann::ordered_json summary;
  summary["initial_loss"] = initial_loss;
  summary["final_loss"] = loss;
  summary["steps"] = config.steps;
  summary["layout"] = absl::GetFlag(FLAGS_layout);
  summary["retries"] = retries;
  summary["resumes"] = state.resumes;
  if (resets > 0) {
    // The reference never loses momentum: no parity to check.
    summary["parity_skipped"] =
        absl::StrCat(resets,
                     " matrices restarted from zero momentum during the run "
                     "(allow_momentum_reset)");
  } else if (absl::GetFlag(FLAGS_parity)) {
    // The reference runs each matrix with the algorithm the plan chose.
    TrainConfig reference_config = config;
    MUONPS_ASSIGN_OR_RETURN(reference_config.algorithms,
                            testing::NsAlgorithmsOf(client->NsAlgorithms()));
    MUONPS_ASSIGN_OR_RETURN(const std::vector<float> reference,
                            TrainReference(reference_config));
    summary["parity_max_rel_err"] =
        MaxRelativeError(model, model.params_data(), reference.data());
  }
  std::printf("%s\n", summary.dump().c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace example
}  // namespace muonps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = muonps::example::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "mlp_trainer: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
