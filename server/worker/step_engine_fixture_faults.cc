// StepEngineTest's faults (transports that fail or stall at a chosen call)
// and trainer loops that retry until answered.
#include <algorithm>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/worker/step_engine_fixture.h"
#include "transport/loopback_ranks.h"
#include "transport/split_transport.h"

namespace muonps {
namespace worker {
namespace {

// A transport that fails (or stalls at) the call its FaultState is armed
// for; every other call goes through. Control messages on a transport of
// their own (transport/split_transport.h) count in the same sequence, and a
// fault at either aborts both, as a lost peer would.
class FaultyTransport final : public transport::Transport {
 public:
  FaultyTransport(std::unique_ptr<transport::Transport> inner,
                  FaultState* state)
      : owned_(std::move(inner)),
        inner_(owned_.get()),
        state_(state),
        broken_(owned_.get()) {
    transport::Transport* control = inner_->control();
    if (control != inner_) {
      control_.reset(new FaultyTransport(control, state, owned_.get()));
    }
  }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  MemoryKind memory() const override { return inner_->memory(); }
  absl::Status GroupStart() override { return inner_->GroupStart(); }
  absl::Status GroupEnd() override { return inner_->GroupEnd(); }
  absl::Status Send(const void* data, size_t count, DType dtype, int peer,
                    Stream stream) override {
    MUONPS_RETURN_IF_ERROR(Count());
    return inner_->Send(data, count, dtype, peer, stream);
  }
  absl::Status Recv(void* data, size_t count, DType dtype, int peer,
                    Stream stream) override {
    MUONPS_RETURN_IF_ERROR(Count());
    return inner_->Recv(data, count, dtype, peer, stream);
  }
  absl::Status ReduceSum(const float* send, float* recv, size_t count, int root,
                         absl::Span<const int> order, Stream stream) override {
    MUONPS_RETURN_IF_ERROR(Count());
    return inner_->ReduceSum(send, recv, count, root, order, stream);
  }
  absl::Status Broadcast(void* data, size_t count, DType dtype, int root,
                         Stream stream) override {
    MUONPS_RETURN_IF_ERROR(Count());
    return inner_->Broadcast(data, count, dtype, root, stream);
  }
  absl::Status BroadcastIn(transport::Split split, void* data, size_t count,
                           DType dtype, int root, Stream stream) override {
    MUONPS_RETURN_IF_ERROR(Count());
    return inner_->BroadcastIn(split, data, count, dtype, root, stream);
  }
  absl::Status ReduceSumIn(transport::Split split, const float* send,
                           float* recv, size_t count, int root,
                           absl::Span<const int> order,
                           Stream stream) override {
    MUONPS_RETURN_IF_ERROR(Count());
    return inner_->ReduceSumIn(split, send, recv, count, root, order, stream);
  }
  absl::Status Synchronize(Stream stream, absl::Duration timeout) override {
    return inner_->Synchronize(stream, timeout);
  }
  absl::Status AwaitFrom(int peer, size_t count, DType dtype,
                         absl::Duration timeout) override {
    return inner_->AwaitFrom(peer, count, dtype, timeout);
  }
  void Abort(const absl::Status& reason) override { inner_->Abort(reason); }
  RankTree tree() const override { return inner_->tree(); }
  transport::Transport* control() override {
    return control_ != nullptr ? control_.get() : this;
  }

 protected:
  absl::Status OnSplit(transport::Split split,
                       const std::vector<std::vector<int>>& groups,
                       int /*mine*/) override {
    return inner_->FormSplit(split, groups);
  }

 private:
  // The control messages of `broken`, whose Abort a fault here calls.
  FaultyTransport(transport::Transport* inner, FaultState* state,
                  transport::Transport* broken)
      : inner_(inner), state_(state), broken_(broken) {}

  absl::Status Count() {
    absl::Duration stall;
    {
      absl::MutexLock lock(&state_->mu);
      if (!state_->armed) return absl::OkStatus();
      if (state_->counted++ != state_->fault.call) return absl::OkStatus();
      state_->armed = false;
      state_->fired = true;
      stall = state_->fault.stall;
    }
    if (stall > absl::ZeroDuration()) {
      absl::SleepFor(stall);
      return absl::OkStatus();
    }
    const absl::Status fault = absl::UnavailableError("injected fault");
    broken_->Abort(fault);
    return fault;
  }

  const std::unique_ptr<transport::Transport> owned_;  // null: not ours
  transport::Transport* const inner_;
  FaultState* const state_;
  transport::Transport* const broken_;
  std::unique_ptr<FaultyTransport> control_;
};

}  // namespace

TransportFactory StepEngineTest::Connector(int worker) {
  transport::TcpListener* listener = listeners_[worker].get();
  FaultState* state = faults_[worker].get();
  const absl::Duration timeout = IoTimeout();
  const bool split = SplitControl();
  const int fanout = ControlTreeFanout();
  return [listener, state, timeout, split, fanout](
             int rank, const std::vector<std::string>& peers, uint64_t session,
             const std::string& secret)
             -> absl::StatusOr<std::unique_ptr<transport::Transport>> {
    transport::TcpOptions options;
    options.data_plane_secret = secret;
    options.io_timeout = timeout;
    // Connecting is not what these tests time: a rebuilt transport waits
    // for a peer that a fault stalled, and a loaded machine (sanitizers,
    // CI's two cores) may take longer than the I/O timeout to accept.
    options.connect_timeout = std::max(timeout, absl::Seconds(2));
    auto t = transport::TcpTransport::Connect(listener, rank, peers, session,
                                              options);
    if (!t.ok()) return t.status();
    std::unique_ptr<transport::Transport> data = *std::move(t);
    if (split) {
      // The control messages on a mesh of their own (another session), a
      // tree rooted at rank 0 as a GPU worker's beside NCCL.
      transport::TcpOptions tree = options;
      tree.shape = transport::MeshShape::Tree(fanout);
      auto control = transport::TcpTransport::Connect(
          listener, rank, peers, session | (uint64_t{1} << 62), tree);
      if (!control.ok()) return control.status();
      MUONPS_ASSIGN_OR_RETURN(data, transport::SplitTransport::Create(
                                        std::move(data), *std::move(control)));
    }
    return std::unique_ptr<transport::Transport>(
        new FaultyTransport(std::move(data), state));
  };
}

void StepEngineTest::SetFault(int w, const Fault& fault) {
  FaultState& state = *faults_[w];
  absl::MutexLock lock(&state.mu);
  state.fault = fault;
  state.armed = false;
  state.fired = false;
  state.counted = 0;
}

int64_t StepEngineTest::CallsCounted(int w) {
  FaultState& state = *faults_[w];
  absl::MutexLock lock(&state.mu);
  return state.counted;
}

std::vector<int> StepEngineTest::RunTrainerLoops(int64_t first, int64_t last,
                                                 int attempts) {
  std::vector<int> failures(kWorkers, 0);
  std::vector<std::string> gave_up(kWorkers);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      for (int64_t step = first; step <= last; ++step) {
        WriteGradientsOf(w, step);
        v1::StepRequest request;
        request.set_step_id(step);
        request.set_lr(-1);
        request.set_weight_decay(-1);
        request.set_adamw_lr(-1);
        absl::Status last_error;
        bool done = false;
        for (int attempt = 0; attempt < attempts && !done; ++attempt) {
          absl::StatusOr<StepResponse> r = StepFromProto(*engines_[w], request);
          done = r.ok();
          if (!done) {
            ++failures[w];
            last_error = r.status();
          }
        }
        if (!done) {
          gave_up[w] = absl::StrCat("step ", step, ": ", last_error.ToString());
          return;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int w = 0; w < kWorkers; ++w) {
    EXPECT_TRUE(gave_up[w].empty()) << "trainer " << w << " " << gave_up[w];
  }
  return failures;
}

}  // namespace worker
}  // namespace muonps
