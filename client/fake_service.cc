#include "client/fake_service.h"

#include <stdlib.h>
#include <unistd.h>

#include <set>

namespace muonps {
namespace testing {

class FakeService::Coordinator final : public v1::Coordinator::Service {
 public:
  grpc::Status CreateJob(grpc::ServerContext*,
                         const v1::CreateJobRequest* request,
                         v1::Job*) override {
    absl::MutexLock lock(&mu_);
    jobs_.push_back(request->job());
    if (failing_ > 0) {
      --failing_;
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "Socket closed");
    }
    return grpc::Status::OK;
  }

  void Fail(int calls) {
    absl::MutexLock lock(&mu_);
    failing_ = calls;
  }

  std::vector<v1::JobSpec> jobs() const {
    absl::MutexLock lock(&mu_);
    return jobs_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<v1::JobSpec> jobs_ ABSL_GUARDED_BY(mu_);
  int failing_ ABSL_GUARDED_BY(mu_) = 0;
};

class FakeService::Worker final : public v1::Worker::Service {
 public:
  grpc::Status Attach(grpc::ServerContext*, const v1::AttachRequest* request,
                      v1::AttachResponse*) override {
    absl::MutexLock lock(&mu_);
    attaches_.push_back(*request);
    return grpc::Status::OK;
  }

  grpc::Status Step(grpc::ServerContext*, const v1::StepRequest* request,
                    v1::StepResponse* response) override {
    absl::MutexLock lock(&mu_);
    steps_.push_back(*request);
    response->set_step_id(request->step_id());
    response->set_already_applied(!seen_.insert(request->step_id()).second);
    if (response->already_applied()) response->set_last_step(*seen_.rbegin());
    return grpc::Status::OK;
  }

  std::vector<v1::AttachRequest> attaches() const {
    absl::MutexLock lock(&mu_);
    return attaches_;
  }
  std::vector<v1::StepRequest> steps() const {
    absl::MutexLock lock(&mu_);
    return steps_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<v1::AttachRequest> attaches_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::StepRequest> steps_ ABSL_GUARDED_BY(mu_);
  std::set<int64_t> seen_ ABSL_GUARDED_BY(mu_);
};

FakeService::FakeService()
    : coordinator_(std::make_unique<Coordinator>()),
      worker_(std::make_unique<Worker>()) {
  char pattern[] = "/tmp/muonps-client-test-XXXXXX";
  dir_ = mkdtemp(pattern);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + worker_socket(),
                           grpc::InsecureServerCredentials());
  builder.RegisterService(worker_.get());
  server_ = builder.BuildAndStart();
  StartCoordinator();
}

void FakeService::StartCoordinator() {
  if (coordinator_server_ != nullptr) return;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(coordinator_target(),
                           grpc::InsecureServerCredentials());
  builder.RegisterService(coordinator_.get());
  coordinator_server_ = builder.BuildAndStart();
}

void FakeService::StopCoordinator() {
  if (coordinator_server_ == nullptr) return;
  coordinator_server_->Shutdown();
  coordinator_server_->Wait();
  coordinator_server_.reset();
  unlink((dir_ + "/coordinator.sock").c_str());
}

void FakeService::FailCreateJobs(int calls) { coordinator_->Fail(calls); }

FakeService::~FakeService() {
  StopCoordinator();
  server_->Shutdown();
  server_->Wait();
  unlink((dir_ + "/coordinator.sock").c_str());
  unlink(worker_socket().c_str());
  rmdir(dir_.c_str());
}

std::string FakeService::coordinator_target() const {
  return "unix:" + dir_ + "/coordinator.sock";
}

std::string FakeService::worker_socket() const { return dir_ + "/worker.sock"; }

std::vector<v1::JobSpec> FakeService::jobs() const {
  return coordinator_->jobs();
}

std::vector<v1::AttachRequest> FakeService::attaches() const {
  return worker_->attaches();
}

std::vector<v1::StepRequest> FakeService::steps() const {
  return worker_->steps();
}

}  // namespace testing
}  // namespace muonps
