// muonps::Client against an in-process coordinator and worker that record
// what they are sent (client/fake_service.h): parameter groups travel once,
// at attach; every step carries each group's values by index; values that
// are not finite are refused before anything is sent; the host AdamW steps
// each tensor with its group's lr and weight decay, once per step id; with
// HSDP's replica groups a row-sharded matrix's rows are the rank's shard of
// its group, and the job carries them.
#include "client/client.h"

#include <cmath>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/fake_service.h"
#include "common/sanitizer.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace muonps {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kBias = 4;  // elements of each AdamW tensor

class ClientTest : public ::testing::Test {
 protected:
  // A host client of two matrices and two AdamW tensors, declared.
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Client>> client =
        Client::Create({.coordinator = service_.coordinator_target(),
                        .job = "groups",
                        .worker_socket = service_.worker_socket(),
                        .timeout = absl::Seconds(5)});
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    ASSERT_TRUE(client_->AddMatrix("w.a", 4, 8).ok());
    ASSERT_TRUE(client_->AddMatrix("w.b", 8, 4).ok());
    ASSERT_TRUE(
        client_->AddTensor("bias.a", kBias, TensorLayout::kReplicated).ok());
    ASSERT_TRUE(
        client_->AddTensor("bias.b", kBias, TensorLayout::kReplicated).ok());
  }

  void Start() {
    AdamWOptions adamw;
    adamw.lr = 0.01;
    adamw.weight_decay = 0.02;
    ASSERT_TRUE(client_->Start(MuonOptions(), adamw).ok());
  }

  // Writes `param` and `grad` into every element of an AdamW tensor.
  void Fill(const std::string& name, float param, float grad) {
    absl::StatusOr<TensorBuffers> b = client_->Buffers(name);
    ASSERT_TRUE(b.ok()) << b.status();
    for (int64_t i = 0; i < b->elements; ++i) {
      b->param[i] = param;
      b->grad[i] = grad;
    }
  }

  float Param(const std::string& name) {
    absl::StatusOr<TensorBuffers> b = client_->Buffers(name);
    return b.ok() ? b->param[0] : NAN;
  }

  testing::FakeService service_;
  std::unique_ptr<Client> client_;
};

// torch.optim.AdamW's first step from zero moments: the bias-corrected
// update is g / (|g| + eps).
double FirstAdamWStep(double p, double g, double lr, double wd) {
  return p * (1 - lr * wd) - lr * g / (std::abs(g) + 1e-8);
}

TEST_F(ClientTest, GroupsTravelOnceAtAttachAsOnePlusTheirIndex) {
  ASSERT_TRUE(client_->SetGroup(2, {"w.b", "bias.a"}).ok());
  ASSERT_TRUE(client_->SetGroup(0, {"w.a"}).ok());
  Start();
  const std::vector<v1::AttachRequest> attaches = service_.attaches();
  ASSERT_EQ(attaches.size(), 1u);
  std::map<std::string, int> group;
  for (const v1::TensorBinding& b : attaches[0].tensors()) {
    group[b.name()] = b.group();
  }
  EXPECT_EQ(group, (std::map<std::string, int>{
                       {"w.a", 1}, {"w.b", 3}, {"bias.a", 3}, {"bias.b", 0}}));
}

TEST_F(ClientTest, SetGroupRefusesBadGroupsAndNamesNamingTheField) {
  absl::Status s = client_->SetGroup(Client::kMaxParamGroups, {"w.a"});
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("group"));
  s = client_->SetGroup(-1, {"w.a"});
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  s = client_->SetGroup(1, {"w.a", "nope"});
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("names[1]"));
  EXPECT_THAT(s.message(), HasSubstr("\"nope\""));
  // All or nothing: "w.a" was not put in group 1 by the refused call.
  ASSERT_TRUE(client_->SetGroup(0, {"w.a", "bias.b"}).ok());
  s = client_->SetGroup(1, {"bias.a", "bias.b"});
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("names[1]"));
  EXPECT_THAT(s.message(), HasSubstr("already in group 0"));
  s = client_->SetGroup(1, {"w.b", "w.b"});
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  Start();
  s = client_->SetGroup(1, {"w.b"});
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
}

TEST_F(ClientTest, StepCarriesEachGroupsValuesByIndex) {
  ASSERT_TRUE(client_->SetGroup(0, {"w.a"}).ok());
  ASSERT_TRUE(client_->SetGroup(1, {"w.b", "bias.a"}).ok());
  Start();
  StepOptions options;
  options.lr = 0.03;
  options.groups = {{.lr = 0.02, .weight_decay = 0.1},
                    {.lr = 0.005,
                     .weight_decay = -1,
                     .adamw_lr = 0.003,
                     .adamw_weight_decay = 0.05}};
  ASSERT_TRUE(client_->Step(7, options).ok());
  const std::vector<v1::StepRequest> steps = service_.steps();
  ASSERT_EQ(steps.size(), 1u);
  const v1::StepRequest& r = steps[0];
  EXPECT_EQ(r.step_id(), 7);
  EXPECT_EQ(r.lr(), 0.03);
  EXPECT_EQ(r.weight_decay(), -1);
  EXPECT_EQ(r.adamw_lr(), -1);
  ASSERT_EQ(r.groups_size(), 2);
  EXPECT_EQ(r.groups(0).lr(), 0.02);
  EXPECT_EQ(r.groups(0).weight_decay(), 0.1);
  EXPECT_EQ(r.groups(0).adamw_lr(), -1);
  EXPECT_EQ(r.groups(0).adamw_weight_decay(), -1);
  EXPECT_EQ(r.groups(1).lr(), 0.005);
  EXPECT_EQ(r.groups(1).weight_decay(), -1);
  EXPECT_EQ(r.groups(1).adamw_lr(), 0.003);
  EXPECT_EQ(r.groups(1).adamw_weight_decay(), 0.05);
}

TEST_F(ClientTest, ValuesThatAreNotFiniteAreRefusedBeforeAnythingIsSent) {
  ASSERT_TRUE(client_->SetGroup(1, {"bias.a"}).ok());
  Start();
  Fill("bias.a", 1.0f, 0.5f);
  struct Case {
    const char* field;
    void (*set)(StepOptions*);
  };
  const Case cases[] = {
      {"groups[1].adamw_lr",
       [](StepOptions* o) { o->groups[1].adamw_lr = NAN; }},
      {"groups[0].lr", [](StepOptions* o) { o->groups[0].lr = INFINITY; }},
      {"groups[1].adamw_weight_decay",
       [](StepOptions* o) { o->groups[1].adamw_weight_decay = -INFINITY; }},
      {"groups[0].weight_decay",
       [](StepOptions* o) { o->groups[0].weight_decay = NAN; }},
      {"adamw_lr", [](StepOptions* o) { o->adamw_lr = NAN; }},
      {"lr", [](StepOptions* o) { o->lr = -INFINITY; }},
  };
  for (const Case& c : cases) {
    StepOptions options;
    options.groups.resize(2);
    c.set(&options);
    absl::StatusOr<StepResult> r = client_->Step(0, options);
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << c.field;
    EXPECT_THAT(r.status().message(), HasSubstr(c.field));
  }
  // Fewer entries than the groups SetGroup used, and more than there can be.
  StepOptions options;
  options.groups.resize(1);
  absl::StatusOr<StepResult> r = client_->Step(0, options);
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("groups"));
  options.groups.resize(Client::kMaxParamGroups + 1);
  r = client_->Step(0, options);
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_TRUE(service_.steps().empty());
  EXPECT_EQ(Param("bias.a"), 1.0f);
  EXPECT_EQ(client_->adamw_steps(), 0);
}

TEST_F(ClientTest, HostAdamWTakesEachTensorsGroupValuesOncePerStepId) {
  ASSERT_TRUE(client_->SetGroup(1, {"bias.a", "w.a"}).ok());
  Start();
  Fill("bias.a", 1.0f, 0.5f);
  Fill("bias.b", 2.0f, -0.25f);
  StepOptions options;
  options.adamw_lr = 0.04;  // bias.b is in no group: the step's, Start's wd
  options.groups = {{}, {.adamw_lr = 0.1, .adamw_weight_decay = 0.5}};
  absl::StatusOr<StepResult> first = client_->Step(0, options);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->adamw_applied);
  EXPECT_NEAR(Param("bias.a"), FirstAdamWStep(1.0, 0.5, 0.1, 0.5), 1e-6);
  EXPECT_NEAR(Param("bias.b"), FirstAdamWStep(2.0, -0.25, 0.04, 0.02), 1e-6);
  // The same step id again (a retry the worker answers already applied):
  // nothing is stepped twice.
  const float a = Param("bias.a"), b = Param("bias.b");
  absl::StatusOr<StepResult> retry = client_->Step(0, options);
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_TRUE(retry->already_applied);
  EXPECT_FALSE(retry->adamw_applied);
  EXPECT_EQ(Param("bias.a"), a);
  EXPECT_EQ(Param("bias.b"), b);
  EXPECT_EQ(client_->adamw_steps(), 1);
  EXPECT_EQ(client_->last_adamw_step(), 0);
}

// A trainer restarted after its worker committed steps it never saw: its
// first step id is already applied, and its parameters miss those updates.
// It is told which state to load and which step comes next, not OK.
TEST_F(ClientTest, AFreshClientBehindTheWorkersStepsIsToldWhatToReload) {
  Start();
  ASSERT_TRUE(client_->Step(0).ok());
  ASSERT_TRUE(client_->Step(1).ok());
  client_.reset();  // the trainer dies
  absl::StatusOr<std::unique_ptr<Client>> restarted =
      Client::Create({.coordinator = service_.coordinator_target(),
                      .job = "groups",
                      .worker_socket = service_.worker_socket(),
                      .timeout = absl::Seconds(5)});
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  ASSERT_TRUE((*restarted)->AddMatrix("w.a", 4, 8).ok());
  ASSERT_TRUE(
      (*restarted)->AddTensor("bias.a", kBias, TensorLayout::kReplicated).ok());
  const absl::Status started =
      (*restarted)->Start(MuonOptions(), AdamWOptions());
  ASSERT_TRUE(started.ok()) << started;
  absl::StatusOr<StepResult> stale = (*restarted)->Step(0);
  EXPECT_TRUE(absl::IsFailedPrecondition(stale.status())) << stale.status();
  EXPECT_THAT(stale.status().message(),
              HasSubstr("already applied step 0 of job \"groups\" "
                        "(committed through step 1)"));
  EXPECT_THAT(stale.status().message(), HasSubstr("continue with step 2"));
  EXPECT_EQ((*restarted)->adamw_steps(), 0);
  // Resumed where the job is, it steps; a retry of its own step is a no-op.
  ASSERT_TRUE((*restarted)->Step(2).ok());
  absl::StatusOr<StepResult> retry = (*restarted)->Step(2);
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_TRUE(retry->already_applied);
}

TEST_F(ClientTest, NoGroupsMeansEveryTensorTakesTheStepsOwnValues) {
  ASSERT_TRUE(client_->SetGroup(3, {"bias.a"}).ok());
  Start();
  Fill("bias.a", 1.0f, 0.5f);
  ASSERT_TRUE(client_->Step(0, {.adamw_lr = 0.2}).ok());
  EXPECT_NEAR(Param("bias.a"), FirstAdamWStep(1.0, 0.5, 0.2, 0.02), 1e-6);
  EXPECT_EQ(service_.steps().at(0).groups_size(), 0);
}

TEST(ClientCreateTest, RefusesAnUnknownDeviceNamingIt) {
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Create({.coordinator = "127.0.0.1:1",
                      .job = "job",
                      .worker_socket = "/tmp/none.sock",
                      .device = "gpu"});
  EXPECT_TRUE(absl::IsInvalidArgument(client.status())) << client.status();
  EXPECT_THAT(client.status().message(), HasSubstr("device"));
}

// GradientReady records a CUDA job matrix's own event: a host client has
// none (its Step orders the segment's gradients), and it is refused with
// the code and the name before any CUDA call.
TEST_F(ClientTest, GradientReadyIsRefusedOnAHostClientNamingTheMatrix) {
  Start();
  const absl::Status status = client_->GradientReady("w.a", nullptr);
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("matrix \"w.a\""));
}

// A CUDA client (not started: no GPU needed) of job matrix "w" (4 x 8)
// and unreduced AdamW tensor "b" (8).
absl::StatusOr<std::unique_ptr<Client>> CudaClientOfWAndB() {
  MUONPS_ASSIGN_OR_RETURN(std::unique_ptr<Client> client,
                          Client::Create({.coordinator = "127.0.0.1:1",
                                          .job = "job",
                                          .worker_socket = "/tmp/none.sock",
                                          .device = "cuda:0"}));
  MUONPS_RETURN_IF_ERROR(client->AddMatrix("w", 4, 8));
  MUONPS_RETURN_IF_ERROR(client->AddTensor("b", 8, TensorLayout::kUnreduced));
  return client;
}

// A job matrix may lend no gradient buffer (each step places its
// gradient); an AdamW tensor must lend one, and nothing is lent twice.
TEST(ClientCudaTest, OnlyJobMatricesLendNoGradientBuffer) {
  absl::StatusOr<std::unique_ptr<Client>> client = CudaClientOfWAndB();
  ASSERT_TRUE(client.ok()) << client.status();
  // Any non-null pointer: nothing is exported before Start.
  float param = 0;
  EXPECT_TRUE(
      (*client)->LendCuda("w", nullptr, &param, BufferDType::kFloat32).ok());
  absl::Status status =
      (*client)->LendCuda("w", nullptr, &param, BufferDType::kFloat32);
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("lent twice"));
  status = (*client)->LendCuda("b", nullptr, &param, BufferDType::kFloat32);
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("AdamW tensor"));
  status = (*client)->LendCuda("w", &param, nullptr, BufferDType::kFloat32);
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
}

TEST(ClientCudaTest, GradientReadyNamesUndeclaredAdamWAndUnstartedTensors) {
  absl::StatusOr<std::unique_ptr<Client>> client = CudaClientOfWAndB();
  ASSERT_TRUE(client.ok()) << client.status();
  absl::Status status = (*client)->GradientReady("nope", nullptr);
  EXPECT_TRUE(absl::IsNotFound(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("matrix \"nope\": was not declared"));
  status = (*client)->GradientReady("b", nullptr);
  EXPECT_TRUE(absl::IsNotFound(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("tensor \"b\": is an AdamW tensor"));
  status = (*client)->GradientReady("w", nullptr);
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("before Start"));
}

// HSDP: with 2 replica groups of 2 ranks each, trainer 3 holds the rows of
// shard 1 of 2 (TrainerRowRange(31, 1, 2) = [16, 31)), not of rank 3 of 4
// ([24, 31)), in its declared elements and its buffers alike; the job
// carries the replicas. Without them, the split over every trainer stays.
TEST(ClientReplicasTest, RowsAreThoseOfTheRanksShardInItsReplicaGroup) {
  for (const int replicas : {0, 1, 2, 4}) {
    SCOPED_TRACE(replicas);
    testing::FakeService service;
    absl::StatusOr<std::unique_ptr<Client>> client =
        Client::Create({.coordinator = service.coordinator_target(),
                        .job = "hsdp",
                        .worker_socket = service.worker_socket(),
                        .trainer_rank = 3,
                        .trainer_count = 4,
                        .timeout = absl::Seconds(5)});
    ASSERT_TRUE(client.ok()) << client.status();
    ASSERT_TRUE((*client)->SetReplicas(replicas).ok());
    ASSERT_TRUE(
        (*client)
            ->AddMatrix("w", 31, 5, {.layout = TensorLayout::kRowSharded})
            .ok());
    ASSERT_TRUE((*client)->AddMatrix("r", 6, 5).ok());  // replicated
    ASSERT_TRUE((*client)->Start(MuonOptions(), AdamWOptions()).ok());
    absl::StatusOr<TensorBuffers> w = (*client)->Buffers("w");
    ASSERT_TRUE(w.ok()) << w.status();
    // S = 4 / replicas ranks a group; rank 3 is shard 3 % S.
    const std::pair<int64_t, int64_t> want =
        replicas == 2   ? std::pair<int64_t, int64_t>{16, 31}
        : replicas == 4 ? std::pair<int64_t, int64_t>{0, 31}
                        : std::pair<int64_t, int64_t>{24, 31};
    EXPECT_EQ(w->row_begin, want.first);
    EXPECT_EQ(w->row_end, want.second);
    EXPECT_EQ(w->elements, (want.second - want.first) * 5);
    EXPECT_EQ(w->param_elements, w->elements);
    absl::StatusOr<TensorBuffers> r = (*client)->Buffers("r");
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->row_begin, 0);
    EXPECT_EQ(r->row_end, 6);
    const std::vector<v1::JobSpec> jobs = service.jobs();
    ASSERT_EQ(jobs.size(), 1u);
    EXPECT_EQ(jobs[0].trainers(), 4);
    EXPECT_EQ(jobs[0].replicas(), replicas > 1 ? replicas : 0);
    const std::vector<v1::AttachRequest> attaches = service.attaches();
    ASSERT_EQ(attaches.size(), 1u);
    EXPECT_EQ(attaches[0].tensors(0).elements(), w->elements);
  }
}

// A stack sharded on its experts (FSDP2's Shard(0) of a 3-D parameter):
// rank 1 of 2 holds experts [3, 5) of 5 whole, as torch.chunk splits them;
// the job carries shard_experts. Not on another layout, nor a rank left
// with no expert.
TEST(ClientShardExpertsTest, ARankHoldsWholeExpertsAsTorchChunkSplitsThem) {
  testing::FakeService service;
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Create({.coordinator = service.coordinator_target(),
                      .job = "moe",
                      .worker_socket = service.worker_socket(),
                      .trainer_rank = 1,
                      .trainer_count = 2,
                      .timeout = absl::Seconds(5)});
  ASSERT_TRUE(client.ok()) << client.status();
  absl::Status s = (*client)->AddMatrix("replicated", 6, 4,
                                        {.experts = 2, .shard_experts = true});
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("\"replicated\".shard_experts"));
  s = (*client)->AddMatrix("one", 6, 4,
                           {.layout = TensorLayout::kRowSharded,
                            .experts = 1,
                            .shard_experts = true});
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("1 experts split over 2 trainers"));
  ASSERT_TRUE((*client)
                  ->AddMatrix("experts", 6, 4,
                              {.layout = TensorLayout::kRowSharded,
                               .experts = 5,
                               .shard_experts = true})
                  .ok());
  ASSERT_TRUE((*client)->Start(MuonOptions(), AdamWOptions()).ok());
  absl::StatusOr<TensorBuffers> b = (*client)->Buffers("experts");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->expert_begin, 3);
  EXPECT_EQ(b->expert_end, 5);
  EXPECT_EQ(b->row_begin, 0);
  EXPECT_EQ(b->row_end, 6);
  EXPECT_EQ(b->elements, 2 * 6 * 4);
  EXPECT_EQ(b->param_elements, b->elements);
  const std::vector<v1::JobSpec> jobs = service.jobs();
  ASSERT_EQ(jobs.size(), 1u);
  ASSERT_EQ(jobs[0].matrices_size(), 1);
  EXPECT_TRUE(jobs[0].matrices(0).shard_experts());
  EXPECT_EQ(jobs[0].matrices(0).layout(), v1::LAYOUT_ROW_SHARDED);
  const std::vector<v1::AttachRequest> attaches = service.attaches();
  ASSERT_EQ(attaches.size(), 1u);
  EXPECT_EQ(attaches[0].tensors(0).elements(), b->elements);
}

TEST(ClientReplicasTest, BadReplicasAreRefusedNamingTheOption) {
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Create({.coordinator = "127.0.0.1:1",
                      .job = "job",
                      .worker_socket = "/tmp/none.sock",
                      .trainer_rank = 1,
                      .trainer_count = 6});
  ASSERT_TRUE(client.ok()) << client.status();
  absl::Status s = (*client)->SetReplicas(-1);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("replicas: -1 < 0"));
  s = (*client)->SetReplicas(4);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("replicas: 4 replica groups do not "
                                     "divide trainer_count 6"));
  s = (*client)->SetReplicas(7);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_TRUE((*client)->SetReplicas(3).ok());
  EXPECT_TRUE((*client)->SetReplicas(6).ok());
  EXPECT_TRUE((*client)->SetReplicas(1).ok());
  EXPECT_TRUE((*client)->SetReplicas(0).ok());
  // A replicated matrix's rows do not depend on them; a row-sharded one's do.
  ASSERT_TRUE((*client)->AddMatrix("r", 4, 4).ok());
  EXPECT_TRUE((*client)->SetReplicas(2).ok());
  // 1 row over the 3 ranks of a group leaves none to shard 1 (rank 1).
  s = (*client)->AddMatrix("tiny", 1, 4, {.layout = TensorLayout::kRowSharded});
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(),
              HasSubstr("1 rows split over 3 trainers of a replica group"));
  ASSERT_TRUE((*client)
                  ->AddMatrix("w", 12, 4, {.layout = TensorLayout::kRowSharded})
                  .ok());
  s = (*client)->SetReplicas(3);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("replicas"));
  EXPECT_THAT(s.message(), HasSubstr("\"w\""));
}

// A tensor within the bounds whose AdamW moments this host cannot hold is
// refused with RESOURCE_EXHAUSTED naming it, not an abort.
TEST_F(ClientTest, AHugeTensorIsResourceExhaustedNamingIt) {
  if (kAddressSanitizer) {
    GTEST_SKIP() << "AddressSanitizer aborts on allocations this large";
  }
  // With overcommit always on, 4 TiB would be granted and then zero-filled.
  std::string overcommit;
  std::ifstream("/proc/sys/vm/overcommit_memory") >> overcommit;
  if (overcommit == "1") GTEST_SKIP() << "vm.overcommit_memory is 1";
  const absl::Status huge = client_->AddTensor(
      "huge", Client::kMaxTensorElements, TensorLayout::kReplicated);
  EXPECT_EQ(huge.code(), absl::StatusCode::kResourceExhausted) << huge;
  EXPECT_THAT(huge.message(), HasSubstr("\"huge\""));
  // The client goes on: the tensor was not declared.
  EXPECT_TRUE(
      client_->AddTensor("huge", kBias, TensorLayout::kReplicated).ok());
}

// A trainer that starts while its coordinator is down (not up yet, or
// restarting) waits for it within its timeout, with backoff; past the
// timeout it fails naming the call.
TEST_F(ClientTest, StartWaitsForACoordinatorThatIsDown) {
  service_.StopCoordinator();
  std::thread back([this] {
    absl::SleepFor(absl::Seconds(1));
    service_.StartCoordinator();
  });
  const absl::Time start = absl::Now();
  AdamWOptions adamw;
  const absl::Status started = client_->Start(MuonOptions(), adamw);
  back.join();
  EXPECT_TRUE(started.ok()) << started;
  EXPECT_GE(absl::Now() - start, absl::Seconds(1));

  // A CreateJob cut short by a coordinator that went down during the call
  // is sent again.
  service_.FailCreateJobs(2);
  absl::StatusOr<std::unique_ptr<Client>> cut =
      Client::Create({.coordinator = service_.coordinator_target(),
                      .job = "cut",
                      .worker_socket = service_.worker_socket(),
                      .timeout = absl::Seconds(10)});
  ASSERT_TRUE(cut.ok()) << cut.status();
  ASSERT_TRUE((*cut)->AddMatrix("w", 4, 8).ok());
  const size_t jobs_before = service_.jobs().size();
  const absl::Status resent = (*cut)->Start(MuonOptions(), adamw);
  EXPECT_TRUE(resent.ok()) << resent;
  EXPECT_EQ(service_.jobs().size(), jobs_before + 3);

  service_.StopCoordinator();
  absl::StatusOr<std::unique_ptr<Client>> late =
      Client::Create({.coordinator = service_.coordinator_target(),
                      .job = "late",
                      .worker_socket = service_.worker_socket(),
                      .timeout = absl::Seconds(4)});
  ASSERT_TRUE(late.ok()) << late.status();
  ASSERT_TRUE((*late)->AddMatrix("w", 4, 8).ok());
  const absl::Time asked = absl::Now();
  const absl::Status refused = (*late)->Start(MuonOptions(), adamw);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("CreateJob"));
  EXPECT_GE(absl::Now() - asked, absl::Seconds(2));
  EXPECT_LT(absl::Now() - asked, absl::Seconds(10));
}

}  // namespace
}  // namespace muonps
