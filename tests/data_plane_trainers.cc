// DataPlaneFixture's trainer ranks: one muonps::Client per worker, created,
// declared and started concurrently with InitialParam in their parameter
// buffers (StartTrainers), their gradients written (WriteGradients) and
// their steps run one thread per rank (RunStep).
#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "common/status.h"
#include "tests/client_options.h"
#include "tests/data_plane_fixture.h"
#include "tests/data_plane_fixture_internal.h"

namespace muonps {
namespace testing {
namespace {

using scheduler::Layout;

// The model as a trainer hands it to its client (client_types.h): the
// client's own options, converted back to these inside the client.
MatrixOptions ClientOptionsOf(const MatrixDecl& m) {
  return {.layout = ClientLayout(m.options.layout),
          .layer = m.options.layer,
          .experts = m.options.experts,
          .shard_params = m.options.shard_params,
          .shard_experts = m.options.shard_experts};
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> DataPlaneFixture::DeclareTrainer(
    int rank) const {
  MUONPS_ASSIGN_OR_RETURN(
      std::unique_ptr<Client> client,
      Client::Create({.coordinator = coordinator_address_,
                      .job = job_,
                      .worker_socket = workers_.at(rank).socket,
                      .trainer_rank = rank,
                      .trainer_count = workers(),
                      .timeout = options_.client_timeout}));
  if (!options_.checkpoint_dir.empty()) {
    MUONPS_RETURN_IF_ERROR(client->SetCheckpointing(options_.checkpoint_dir,
                                                    options_.checkpoint_every));
  }
  if (options_.replicas > 0) {
    MUONPS_RETURN_IF_ERROR(client->SetReplicas(options_.replicas));
  }
  for (const MatrixDecl& m : model_.matrices) {
    MUONPS_RETURN_IF_ERROR(
        client->AddMatrix(m.name, m.rows, m.cols, ClientOptionsOf(m)));
  }
  for (const TensorDecl& t : model_.tensors) {
    MUONPS_RETURN_IF_ERROR(
        client->AddTensor(t.name, t.elements, ClientLayout(t.layout)));
  }
  MUONPS_RETURN_IF_ERROR(
      client->AllowMomentumReset(options_.allow_momentum_reset));
  return client;
}

absl::StatusOr<SavedTrainer> DataPlaneFixture::SaveTrainer(int rank,
                                                           int64_t step) const {
  SavedTrainer saved;
  saved.step = step;
  for (const MatrixDecl& m : model_.matrices) {
    const TensorBuffers b = Buffers(rank, m.name);
    saved.params[m.name].assign(b.param, b.param + b.param_elements);
  }
  for (const TensorDecl& t : model_.tensors) {
    const TensorBuffers b = Buffers(rank, t.name);
    saved.params[t.name].assign(b.param, b.param + b.param_elements);
    MUONPS_ASSIGN_OR_RETURN(auto state, clients_[rank]->AdamWState(t.name));
    saved.moments[t.name] = {
        std::vector<float>(state.first, state.first + t.elements),
        std::vector<float>(state.second, state.second + t.elements)};
  }
  saved.adamw_steps = clients_[rank]->adamw_steps();
  saved.last_adamw_step = clients_[rank]->last_adamw_step();
  return saved;
}

absl::Status DataPlaneFixture::RestartTrainer(int rank) {
  MUONPS_ASSIGN_OR_RETURN(const SavedTrainer saved, SaveTrainer(rank, -1));
  return RestartTrainerFrom(rank, saved, /*resume=*/false);
}

absl::Status DataPlaneFixture::RestartTrainerFrom(int rank,
                                                  const SavedTrainer& saved,
                                                  bool resume) {
  clients_[rank].reset();
  MUONPS_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, DeclareTrainer(rank));
  MUONPS_RETURN_IF_ERROR(
      client->Start(ClientMuon(model_.muon), ClientAdamW(model_.adamw)));
  clients_[rank] = std::move(client);
  for (const auto& [name, values] : saved.params) {
    const TensorBuffers b = Buffers(rank, name);
    std::copy(values.begin(), values.end(), b.param);
  }
  for (const auto& [name, m] : saved.moments) {
    MUONPS_RETURN_IF_ERROR(
        clients_[rank]->RestoreAdamW(name, m.first, m.second));
  }
  clients_[rank]->set_adamw_steps(saved.adamw_steps);
  if (resume) return clients_[rank]->ResumeAfter(saved.step);
  clients_[rank]->set_last_adamw_step(saved.last_adamw_step);
  return absl::OkStatus();
}

void DataPlaneFixture::StartTrainers(absl::Status* start_status) {
  const int n = workers();
  for (int r = 0; r < n; ++r) {
    absl::StatusOr<std::unique_ptr<Client>> created = DeclareTrainer(r);
    ASSERT_TRUE(created.ok()) << created.status();
    clients_.push_back(*std::move(created));
  }
  // Every rank starts at once, as trainer processes would.
  std::vector<absl::Status> started(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([this, r, &started] {
      started[r] = clients_[r]->Start(ClientMuon(model_.muon),
                                      ClientAdamW(model_.adamw));
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    if (start_status != nullptr && !started[r].ok()) {
      *start_status = started[r];
      return;
    }
    ASSERT_TRUE(started[r].ok()) << "trainer " << r << ": " << started[r];
  }
  int t = 0;
  for (const MatrixDecl& m : model_.matrices) {
    for (int r = 0; r < n; ++r) {
      const TensorBuffers b = Buffers(r, m.name);
      const bool sharded = ShardedParam(m);
      const int64_t begin = sharded ? b.row_begin : 0;
      const int64_t end = sharded ? b.row_end : m.rows;
      const int64_t first = sharded ? b.expert_begin : 0;
      for (int64_t i = 0; i < b.param_elements; ++i) {
        b.param[i] =
            InitialParam(t, FullIndex(i, m.rows, m.cols, begin, end, first));
      }
    }
    ++t;
  }
  for (const TensorDecl& d : model_.tensors) {
    for (int r = 0; r < n; ++r) {
      const TensorBuffers b = Buffers(r, d.name);
      for (int64_t i = 0; i < b.param_elements; ++i) {
        b.param[i] = InitialParam(t, i);
      }
    }
    ++t;
  }
}

void DataPlaneFixture::WriteGradients(int rank, int64_t step) {
  int t = 0;
  for (const MatrixDecl& m : model_.matrices) {
    const TensorBuffers b = Buffers(rank, m.name);
    const int from = m.options.layout == Layout::kUnreduced ? rank : -1;
    for (int64_t i = 0; i < b.elements; ++i) {
      b.grad[i] = Gradient(
          t, step, from,
          FullIndex(i, m.rows, m.cols, b.row_begin, b.row_end, b.expert_begin));
    }
    ++t;
  }
  for (const TensorDecl& d : model_.tensors) {
    const TensorBuffers b = Buffers(rank, d.name);
    const int from = d.layout == Layout::kUnreduced ? rank : -1;
    for (int64_t i = 0; i < b.elements; ++i) {
      b.grad[i] = Gradient(t, step, from, i);
    }
    ++t;
  }
}

TensorBuffers DataPlaneFixture::Buffers(int rank,
                                        const std::string& name) const {
  absl::StatusOr<TensorBuffers> b = clients_.at(rank)->Buffers(name);
  if (!b.ok()) {
    ADD_FAILURE() << "rank " << rank << ": " << b.status();
    return {};
  }
  return *b;
}

std::vector<std::optional<StepOutcome>> DataPlaneFixture::RunStep(
    int64_t step, const StepScript& script) {
  std::vector<std::optional<StepOutcome>> out(trainers());
  std::vector<std::thread> threads;
  for (int r = 0; r < trainers(); ++r) {
    if (script.silent.count(r) != 0) continue;
    threads.emplace_back([this, r, step, &script, &out] {
      auto delay = script.delay.find(r);
      if (delay != script.delay.end()) absl::SleepFor(delay->second);
      if (script.write_gradients) WriteGradients(r, step);
      if (script.after_write) script.after_write(r);
      const absl::Time start = absl::Now();
      absl::StatusOr<StepResult> result = clients_[r]->Step(step);
      out[r] = StepOutcome{std::move(result), absl::Now() - start};
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

}  // namespace testing
}  // namespace muonps
