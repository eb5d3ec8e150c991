// libFuzzer target: the worker's request handling, on a real StepEngine
// with the CPU backend (what muonps.v1.Worker's Attach, Step, GetMomentum
// and SetMomentum call; WorkerService adds only the status conversion and
// needs a coordinator for its agent). Each record of the input
// (fuzz/fuzz_input.h) is a plan sent by the coordinator for the fixed job
// (fuzz/worker_fixture.h) or a trainer's request, parsed from its payload,
// so attachments and steps follow plans as they do on a live worker. The
// trainer's buffers are a real shared-memory segment the harness creates
// once; requests may name any offsets in it (the engine must refuse those
// outside). One rank only: a plan of more workers gets a transport factory
// error. Any status is fine; a crash, a sanitizer report or a hang is a
// finding.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "fuzz/fuzz_input.h"
#include "fuzz/worker_fixture.h"
#include "lending/shared_memory.h"
#include "server/worker/step_engine.h"
#include "server/worker/wire.h"
#include "spdlog/spdlog.h"
#include "transport/tcp_transport.h"

namespace muonps {
namespace fuzz {
namespace {

// The process's one segment and listener, made on first use and kept.
struct WorkerWorld {
  SharedMemorySegment segment;
  std::unique_ptr<transport::TcpListener> listener;
};

// The name is unique to the process and moment (sandboxed test runs share
// /dev/shm but may share pids too); the segment is removed at exit.
WorkerWorld* World() {
  static WorkerWorld world = [] {
    spdlog::set_level(spdlog::level::off);
    auto segment = SharedMemorySegment::Create(
        absl::StrCat("/muonps-fuzz-worker-", getpid(), "-",
                     absl::ToUnixNanos(absl::Now())),
        kFuzzSegmentBytes);
    auto listener = transport::TcpListener::Bind("127.0.0.1", 0);
    if (!segment.ok() || !listener.ok()) {
      std::fprintf(stderr, "worker_rpc_fuzzer: setup failed: %s %s\n",
                   segment.status().ToString().c_str(),
                   listener.status().ToString().c_str());
      std::abort();
    }
    return WorkerWorld{*std::move(segment), *std::move(listener)};
  }();
  return &world;
}

std::unique_ptr<worker::StepEngine> MakeEngine(WorkerWorld* world) {
  worker::StepBackend backend = worker::CpuStepBackend(absl::Seconds(2));
  const std::string segment = world->segment.name();
  // Whatever segment a request names, the harness's is opened (never
  // another process's); its size and offsets stay the request's.
  backend.open_buffers = [segment](const worker::AttachRequest& request) {
    worker::AttachRequest ours = request;
    ours.segment = segment;
    return worker::OpenSharedMemoryBuffers(ours);
  };
  transport::TcpListener* listener = world->listener.get();
  auto engine = std::make_unique<worker::StepEngine>(
      kFuzzWorkerId, std::move(backend),
      [listener](int rank, const std::vector<std::string>& peers,
                 uint64_t session, const std::string& data_plane_secret)
          -> absl::StatusOr<std::unique_ptr<transport::Transport>> {
        if (peers.size() != 1) {
          return absl::UnavailableError("fuzz harness: one rank only");
        }
        transport::TcpOptions options;
        options.io_timeout = absl::Seconds(2);
        options.connect_timeout = absl::Seconds(2);
        options.data_plane_secret = data_plane_secret;
        auto t = transport::TcpTransport::Connect(listener, rank, peers,
                                                  session, options);
        if (!t.ok()) return t.status();
        return std::unique_ptr<transport::Transport>(*std::move(t));
      });
  // What JoinJob hands a worker; one rank never handshakes, but the
  // transport requires a secret all the same.
  engine->SetDataPlaneSecret("fuzz-data-plane-secret-0123456789abcdef");
  return engine;
}

void Trace(const FuzzRecord& record, const absl::Status& status) {
  TraceCall(record.tag, static_cast<int>(status.code()),
            std::string(status.message()));
}

void Run(const FuzzRecord& record, const v1::JobSpec& job,
         worker::StepEngine* engine, const std::string& address) {
  const std::string& p = record.payload;
  switch (static_cast<WorkerCall>(record.tag % kWorkerCallCount)) {
    case WorkerCall::kSetPlan: {
      v1::Plan plan;
      if (!plan.ParseFromString(p)) return;
      absl::StatusOr<worker::JobPlan> next =
          worker::JobPlanFromProto(job, plan);
      Trace(record, next.ok()
                        ? engine->SetPlan(*next, {{kFuzzWorkerId, address}})
                        : next.status());
      return;
    }
    case WorkerCall::kAttach: {
      v1::AttachRequest request;
      if (!request.ParseFromString(p)) return;
      absl::StatusOr<worker::AttachRequest> attach =
          worker::AttachRequestFromProto(request);
      Trace(record,
            attach.ok() ? engine->Attach(*attach).status() : attach.status());
      return;
    }
    case WorkerCall::kStep: {
      v1::StepRequest request;
      if (request.ParseFromString(p)) {
        Trace(record,
              engine->Step(worker::StepRequestFromProto(request)).status());
      }
      return;
    }
    case WorkerCall::kGetMomentum: {
      v1::GetMomentumRequest request;
      if (request.ParseFromString(p)) {
        Trace(record,
              engine->Momentum(request.matrix(), request.expert()).status());
      }
      return;
    }
    case WorkerCall::kSetMomentum: {
      v1::SetMomentumRequest request;
      if (request.ParseFromString(p)) {
        Trace(record,
              engine->SetMomentum(request.matrix(), request.expert(),
                                  std::vector<float>(request.values().begin(),
                                                     request.values().end())));
      }
      return;
    }
    case WorkerCall::kReleaseTrainerIfGone:
      (void)engine->ReleaseTrainerIfGone();
      return;
    case WorkerCall::kFollowStep:
      Trace(record, engine->FollowStep(absl::Milliseconds(1)).status());
      return;
  }
}

}  // namespace
}  // namespace fuzz
}  // namespace muonps

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace muonps::fuzz;
  WorkerWorld* world = World();
  static const muonps::v1::JobSpec job = FuzzWorkerJob();
  const std::string address = world->listener->address();
  std::unique_ptr<muonps::worker::StepEngine> engine = MakeEngine(world);
  FuzzInput input(data, size);
  FuzzRecord record;
  while (input.Next(&record)) Run(record, job, engine.get(), address);
  return 0;
}
