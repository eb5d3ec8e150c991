// The C ABI's contract: version, handles, error codes and messages naming
// the field without a running service, and what a step sends against an
// in-process fake one (client/fake_service.h). The whole flow against real
// processes runs in tests/ and the Python package.
#include "client/muonps_c.h"

#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "client/fake_service.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

using ::testing::HasSubstr;

// A "cuda:0" client (no CUDA call yet: none needs a GPU) that declared the
// 4 x 8 replicated matrix "w".
// A client on `device` ("cpu" or "cuda:0") with one 4 x 8 replicated
// matrix "w" declared.
void ClientOfMatrixW(const char* device, muonps_client** client) {
  ASSERT_EQ(muonps_client_create_on("127.0.0.1:1", "job", "/tmp/none.sock", 0,
                                    1, 0.5, device, client),
            MUONPS_OK)
      << muonps_last_create_error();
  ASSERT_EQ(muonps_client_add_matrix(*client, "w", 4, 8, 1,
                                     MUONPS_LAYOUT_REPLICATED, 0),
            MUONPS_OK);
}

void CudaClientOfMatrixW(muonps_client** cuda) {
  ClientOfMatrixW("cuda:0", cuda);
}

TEST(MuonpsCTest, VersionNamesTheAbi) {
  EXPECT_EQ(muonps_abi_version(), MUONPS_C_ABI_VERSION);
  EXPECT_THAT(std::string(muonps_version()),
              HasSubstr("C ABI " + std::to_string(MUONPS_C_ABI_VERSION)));
}

// ABI 5: the restored AdamW state's last step; -1 is "none", below refused.
TEST(MuonpsCTest, SetLastAdamWStepChecksItsArguments) {
  EXPECT_EQ(muonps_client_set_last_adamw_step(nullptr, 3),
            MUONPS_INVALID_ARGUMENT);
  muonps_client* client = nullptr;
  ASSERT_EQ(muonps_client_create("127.0.0.1:1", "job", "/tmp/muonps-none.sock",
                                 0, 1, 1, &client),
            MUONPS_OK)
      << muonps_last_create_error();
  EXPECT_EQ(muonps_client_set_last_adamw_step(client, -2),
            MUONPS_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(muonps_client_last_error(client)),
              HasSubstr("step_id"));
  EXPECT_EQ(muonps_client_set_last_adamw_step(client, -1), MUONPS_OK);
  EXPECT_EQ(muonps_client_set_last_adamw_step(client, 41), MUONPS_OK);
  muonps_client_destroy(client);
}

// ABI 7: the step a restarted trainer's state is as of; below -1 refused.
TEST(MuonpsCTest, ResumeAfterChecksItsArguments) {
  EXPECT_EQ(muonps_client_resume_after(nullptr, 3), MUONPS_INVALID_ARGUMENT);
  muonps_client* client = nullptr;
  ASSERT_EQ(muonps_client_create("127.0.0.1:1", "job", "/tmp/muonps-none.sock",
                                 0, 1, 1, &client),
            MUONPS_OK)
      << muonps_last_create_error();
  EXPECT_EQ(muonps_client_resume_after(client, -2), MUONPS_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(muonps_client_last_error(client)), HasSubstr("step"));
  EXPECT_EQ(muonps_client_resume_after(client, -1), MUONPS_OK);
  EXPECT_EQ(muonps_client_resume_after(client, 41), MUONPS_OK);
  muonps_client_destroy(client);
}

// The job's allow_momentum_reset: settable before start, any nonzero is
// true; a null client is refused.
TEST(MuonpsCTest, AllowMomentumResetIsSetBeforeStart) {
  EXPECT_EQ(muonps_client_allow_momentum_reset(nullptr, 1),
            MUONPS_INVALID_ARGUMENT);
  muonps_client* client = nullptr;
  ASSERT_EQ(muonps_client_create("127.0.0.1:1", "job", "/tmp/muonps-none.sock",
                                 0, 1, 1, &client),
            MUONPS_OK)
      << muonps_last_create_error();
  EXPECT_EQ(muonps_client_allow_momentum_reset(client, 1), MUONPS_OK);
  EXPECT_EQ(muonps_client_allow_momentum_reset(client, 0), MUONPS_OK);
  muonps_client_destroy(client);
}

// ABI 9: HSDP's replica groups, against an in-process service: the job
// carries them and trainer 3 of 4 in 2 groups holds the rows of shard 1 of
// 2; bad values name `replicas`, and a null client is refused.
TEST(MuonpsCTest, Abi9SetReplicasSplitsRowsOverTheRanksOfAReplicaGroup) {
  EXPECT_EQ(muonps_client_set_replicas(nullptr, 2), MUONPS_INVALID_ARGUMENT);
  muonps::testing::FakeService service;
  muonps_client* client = nullptr;
  ASSERT_EQ(
      muonps_client_create(service.coordinator_target().c_str(), "hsdp",
                           service.worker_socket().c_str(), 3, 4, 5, &client),
      MUONPS_OK)
      << muonps_last_create_error();
  EXPECT_EQ(muonps_client_set_replicas(client, -2), MUONPS_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(muonps_client_last_error(client)),
              HasSubstr("replicas"));
  EXPECT_EQ(muonps_client_set_replicas(client, 3), MUONPS_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(muonps_client_last_error(client)),
              HasSubstr("replicas: 3 replica groups do not divide "
                        "trainer_count 4"));
  ASSERT_EQ(muonps_client_set_replicas(client, 2), MUONPS_OK);
  ASSERT_EQ(muonps_client_add_matrix(client, "w", 31, 5, 1,
                                     MUONPS_LAYOUT_ROW_SHARDED, 0),
            MUONPS_OK);
  // Experts split whole over the 2 ranks of a group: shard 1 holds 2 of 3.
  ASSERT_EQ(muonps_client_add_matrix(client, "experts", 6, 4, 3,
                                     MUONPS_LAYOUT_ROW_SHARDED_EXPERTS, 1),
            MUONPS_OK);
  EXPECT_EQ(muonps_client_add_tensor(client, "bias", 4,
                                     MUONPS_LAYOUT_ROW_SHARDED_EXPERTS),
            MUONPS_INVALID_ARGUMENT);
  EXPECT_EQ(muonps_client_set_replicas(client, 4), MUONPS_FAILED_PRECONDITION);
  EXPECT_THAT(std::string(muonps_client_last_error(client)),
              HasSubstr("replicas"));
  muonps_muon_hyper muon{};
  muon.lr = 0.02;
  muon.weight_decay = 0.1;
  muon.momentum = 0.95;
  const muonps_adamw_hyper adamw{1e-3, 0.9, 0.999, 1e-8, 0.0};
  ASSERT_EQ(muonps_client_start(client, &muon, &adamw), MUONPS_OK)
      << muonps_client_last_error(client);
  int64_t elements = 0, begin = -1, end = -1;
  ASSERT_EQ(muonps_client_buffers(client, "w", nullptr, nullptr, &elements,
                                  &begin, &end),
            MUONPS_OK);
  EXPECT_EQ(begin, 16);  // torch.chunk's shard 1 of 31 rows over 2
  EXPECT_EQ(end, 31);
  EXPECT_EQ(elements, 15 * 5);
  ASSERT_EQ(muonps_client_buffers(client, "experts", nullptr, nullptr,
                                  &elements, &begin, &end),
            MUONPS_OK);
  EXPECT_EQ(begin, 0);  // whole experts: every row of each
  EXPECT_EQ(end, 6);
  EXPECT_EQ(elements, 1 * 6 * 4);  // experts [2, 3) of torch.chunk's 2 + 1
  const std::vector<muonps::v1::JobSpec> jobs = service.jobs();
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0].replicas(), 2);
  ASSERT_EQ(jobs[0].matrices_size(), 2);
  EXPECT_FALSE(jobs[0].matrices(0).shard_experts());
  EXPECT_TRUE(jobs[0].matrices(1).shard_experts());
  EXPECT_EQ(muonps_client_set_replicas(client, 2), MUONPS_FAILED_PRECONDITION);
  muonps_client_destroy(client);
}

TEST(MuonpsCTest, CreateRejectsBadArgumentsWithAMessage) {
  muonps_client* client = reinterpret_cast<muonps_client*>(0x1);
  EXPECT_EQ(muonps_client_create(nullptr, "job", "/tmp/s", 0, 1, 0, &client),
            MUONPS_INVALID_ARGUMENT);
  EXPECT_EQ(client, nullptr);
  EXPECT_THAT(std::string(muonps_last_create_error()), HasSubstr("NULL"));
  EXPECT_EQ(
      muonps_client_create("127.0.0.1:1", "job", "/tmp/s", 2, 2, 0, &client),
      MUONPS_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(muonps_last_create_error()),
              HasSubstr("trainer_rank"));
  EXPECT_EQ(muonps_client_create("127.0.0.1:1", "", "/tmp/s", 0, 1, 0, &client),
            MUONPS_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(muonps_last_create_error()), HasSubstr("job"));
}

TEST(MuonpsCTest, Abi3RefusesBadDevicesGroupsAndLending) {
  muonps_client* client = reinterpret_cast<muonps_client*>(0x1);
  EXPECT_EQ(muonps_client_create_on("127.0.0.1:1", "job", "/tmp/s", 0, 1, 0,
                                    "gpu", &client),
            MUONPS_INVALID_ARGUMENT);
  EXPECT_EQ(client, nullptr);
  EXPECT_THAT(std::string(muonps_last_create_error()), HasSubstr("device"));
  ASSERT_EQ(muonps_client_create_on("127.0.0.1:1", "job", "/tmp/s", 0, 1, 0.5,
                                    "cpu", &client),
            MUONPS_OK);
  ASSERT_EQ(muonps_client_add_matrix(client, "w", 4, 8, 1,
                                     MUONPS_LAYOUT_REPLICATED, 0),
            MUONPS_OK);
  const char* names[] = {"w"};
  EXPECT_EQ(muonps_client_set_group(client, MUONPS_MAX_GROUPS, names, 1),
            MUONPS_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(muonps_client_last_error(client)),
              HasSubstr("group"));
  EXPECT_EQ(muonps_client_set_group(client, 0, names, 1), MUONPS_OK);
  // Lending CUDA buffers needs a CUDA client.
  EXPECT_EQ(muonps_client_lend_cuda(client, "w", 0x1000, 0x2000, "bf16"),
            MUONPS_FAILED_PRECONDITION);
  EXPECT_THAT(std::string(muonps_client_last_error(client)), HasSubstr("cuda"));
  // An element type the workers cannot take is named before anything else.
  EXPECT_EQ(muonps_client_lend_cuda(client, "w", 0x1000, 0x2000, "int8"),
            MUONPS_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(muonps_client_last_error(client)),
              HasSubstr("dtype"));
  muonps_step_options options{};
  options.group_count = MUONPS_MAX_GROUPS + 1;  // more than any array holds
  EXPECT_EQ(muonps_client_step_with(client, 0, &options, nullptr),
            MUONPS_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(muonps_client_last_error(client)),
              HasSubstr("group_count"));
  muonps_client_destroy(client);
}

// ABI 6: set_group takes AdamW tensors too and checks every name at once,
// naming the one it refuses; nothing of a refused call sticks.
TEST(MuonpsCTest, Abi6SetGroupTakesAdamWTensorsAndNamesTheBadName) {
  muonps_client* client = nullptr;
  ASSERT_EQ(muonps_client_create("127.0.0.1:1", "job", "/tmp/none.sock", 0, 1,
                                 0.5, &client),
            MUONPS_OK);
  ASSERT_EQ(muonps_client_add_matrix(client, "w", 4, 8, 1,
                                     MUONPS_LAYOUT_REPLICATED, 0),
            MUONPS_OK);
  ASSERT_EQ(muonps_client_add_tensor(client, "b", 8, MUONPS_LAYOUT_REPLICATED),
            MUONPS_OK);
  const char* unknown[] = {"w", "nope"};
  EXPECT_EQ(muonps_client_set_group(client, 1, unknown, 2),
            MUONPS_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(muonps_client_last_error(client)),
              HasSubstr("names[1]"));
  const char* both[] = {"w", "b"};
  EXPECT_EQ(muonps_client_set_group(client, 1, both, 2), MUONPS_OK);
  const char* again[] = {"b"};
  EXPECT_EQ(muonps_client_set_group(client, 2, again, 1),
            MUONPS_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(muonps_client_last_error(client)),
              HasSubstr("already in group 1"));
  const char* null_name[] = {nullptr};
  EXPECT_EQ(muonps_client_set_group(client, 2, null_name, 1),
            MUONPS_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(muonps_client_last_error(client)),
              HasSubstr("names[0]"));
  EXPECT_EQ(muonps_client_set_group(client, 2, nullptr, 0), MUONPS_OK);
  muonps_client_destroy(client);
}

// ABI 8: a gradient's own event exists for a CUDA client's job matrices
// once started; every other call is refused with its code, naming the
// tensor, before any CUDA call (this test needs no GPU).
TEST(MuonpsCTest, Abi8GradientReadyIsForACudaClientsStartedMatrices) {
  EXPECT_EQ(muonps_client_gradient_ready(nullptr, "w", nullptr),
            MUONPS_INVALID_ARGUMENT);
  muonps_client* host = nullptr;
  ASSERT_NO_FATAL_FAILURE(ClientOfMatrixW("cpu", &host));
  EXPECT_EQ(muonps_client_gradient_ready(host, nullptr, nullptr),
            MUONPS_INVALID_ARGUMENT);
  EXPECT_EQ(muonps_client_gradient_ready(host, "w", nullptr),
            MUONPS_FAILED_PRECONDITION);
  EXPECT_THAT(std::string(muonps_client_last_error(host)),
              HasSubstr("matrix \"w\""));
  EXPECT_THAT(std::string(muonps_client_last_error(host)), HasSubstr("cuda"));
  muonps_client_destroy(host);

  muonps_client* cuda = nullptr;
  ASSERT_NO_FATAL_FAILURE(CudaClientOfMatrixW(&cuda));
  ASSERT_EQ(muonps_client_add_tensor(cuda, "b", 8, MUONPS_LAYOUT_UNREDUCED),
            MUONPS_OK);
  EXPECT_EQ(muonps_client_gradient_ready(cuda, "nope", nullptr),
            MUONPS_NOT_FOUND);
  EXPECT_THAT(std::string(muonps_client_last_error(cuda)),
              HasSubstr("\"nope\""));
  EXPECT_EQ(muonps_client_gradient_ready(cuda, "b", nullptr), MUONPS_NOT_FOUND);
  EXPECT_THAT(std::string(muonps_client_last_error(cuda)), HasSubstr("AdamW"));
  EXPECT_EQ(muonps_client_gradient_ready(cuda, "w", nullptr),
            MUONPS_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(muonps_client_last_error(cuda)), HasSubstr("Start"));
  muonps_client_destroy(cuda);
}

// ABI 11 and 12: placing a gradient elsewhere, and gradient memory of the
// client's own, are for a CUDA client's declared job matrices once
// started; every refusal names what it refuses, before any CUDA call (this
// test needs no GPU), and leaves no memory behind. Freeing nothing is fine.
TEST(MuonpsCTest, Abi11And12GradientPlacesAreForACudaClientsStartedMatrices) {
  uint64_t ptr = 7;
  const std::vector<
      std::pair<std::string, std::function<int(muonps_client*, const char*)>>>
      calls = {{"place",
                [](muonps_client* c, const char* name) {
                  return muonps_client_place_gradient(c, name, 0);
                }},
               {"allocate", [&ptr](muonps_client* c, const char* name) {
                  return muonps_client_allocate_gradient(c, name, &ptr);
                }}};
  for (const auto& [what, call] : calls) {
    SCOPED_TRACE(what);
    EXPECT_EQ(call(nullptr, "w"), MUONPS_INVALID_ARGUMENT);
    muonps_client* host = nullptr;
    ASSERT_NO_FATAL_FAILURE(ClientOfMatrixW("cpu", &host));
    EXPECT_EQ(call(host, nullptr), MUONPS_INVALID_ARGUMENT);
    EXPECT_EQ(call(host, "w"), MUONPS_FAILED_PRECONDITION);
    EXPECT_THAT(std::string(muonps_client_last_error(host)),
                HasSubstr("matrix \"w\""));
    muonps_client_destroy(host);

    muonps_client* cuda = nullptr;
    ASSERT_NO_FATAL_FAILURE(CudaClientOfMatrixW(&cuda));
    ASSERT_EQ(muonps_client_add_tensor(cuda, "b", 8, MUONPS_LAYOUT_UNREDUCED),
              MUONPS_OK);
    EXPECT_EQ(call(cuda, "nope"), MUONPS_NOT_FOUND);
    EXPECT_THAT(std::string(muonps_client_last_error(cuda)),
                HasSubstr("\"nope\""));
    EXPECT_EQ(call(cuda, "b"), MUONPS_NOT_FOUND);
    EXPECT_THAT(std::string(muonps_client_last_error(cuda)),
                HasSubstr("AdamW"));
    EXPECT_EQ(call(cuda, "w"), MUONPS_INVALID_ARGUMENT);
    EXPECT_THAT(std::string(muonps_client_last_error(cuda)),
                HasSubstr("Start"));
    EXPECT_EQ(muonps_client_allocate_gradient(cuda, "w", nullptr),
              MUONPS_INVALID_ARGUMENT);
    muonps_client_destroy(cuda);
  }
  EXPECT_EQ(ptr, 0u);
  EXPECT_EQ(muonps_free_cuda_memory(0), MUONPS_OK);
}

// ABI 10: a forward's waits for the parameters are a CUDA client's; the
// step's async mode is 0, 1 or 2, and a count of matrices is -1 (all) or
// one of the declared ones; each refusal names what it refuses, before any
// CUDA call (this test needs no GPU).
TEST(MuonpsCTest, Abi10ForwardWaitsAreACudaClientsWithTheirCountChecked) {
  EXPECT_EQ(muonps_client_wait_for_parameters(nullptr, nullptr, -1),
            MUONPS_INVALID_ARGUMENT);
  muonps_client* host = nullptr;
  ASSERT_EQ(muonps_client_create("127.0.0.1:1", "job", "/tmp/none.sock", 0, 1,
                                 0.5, &host),
            MUONPS_OK);
  EXPECT_EQ(muonps_client_wait_for_parameters(host, nullptr, -1),
            MUONPS_FAILED_PRECONDITION);
  EXPECT_THAT(std::string(muonps_client_last_error(host)), HasSubstr("cuda"));
  muonps_step_options options{};
  options.async = 3;
  EXPECT_EQ(muonps_client_step_with(host, 0, &options, nullptr),
            MUONPS_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(muonps_client_last_error(host)),
              HasSubstr("async: 3"));
  muonps_client_destroy(host);

  muonps_client* cuda = nullptr;
  ASSERT_NO_FATAL_FAILURE(CudaClientOfMatrixW(&cuda));
  for (const int64_t bad : {int64_t{-2}, int64_t{2}}) {
    EXPECT_EQ(muonps_client_wait_for_parameters(cuda, nullptr, bad),
              MUONPS_INVALID_ARGUMENT);
    EXPECT_THAT(std::string(muonps_client_last_error(cuda)),
                HasSubstr("matrices: " + std::to_string(bad)));
  }
  // No step enqueued yet: nothing to wait for.
  EXPECT_EQ(muonps_client_wait_for_parameters(cuda, nullptr, 1), MUONPS_OK);
  muonps_client_destroy(cuda);
}

// ABI 6, against an in-process worker: the four per-group arrays reach the
// step request by index (a NULL array keeps the step's values: -1), and a
// host client's AdamW steps each tensor with its group's lr and decay.
TEST(MuonpsCTest, Abi6StepWithSendsGroupsByIndexAndStepsAdamWPerGroup) {
  muonps::testing::FakeService service;
  muonps_client* client = nullptr;
  ASSERT_EQ(
      muonps_client_create(service.coordinator_target().c_str(), "job",
                           service.worker_socket().c_str(), 0, 1, 5, &client),
      MUONPS_OK)
      << muonps_last_create_error();
  ASSERT_EQ(muonps_client_add_matrix(client, "w", 4, 8, 1,
                                     MUONPS_LAYOUT_REPLICATED, 0),
            MUONPS_OK);
  ASSERT_EQ(muonps_client_add_tensor(client, "b", 2, MUONPS_LAYOUT_REPLICATED),
            MUONPS_OK);
  const char* second[] = {"b"};
  ASSERT_EQ(muonps_client_set_group(client, 1, second, 1), MUONPS_OK);
  muonps_muon_hyper muon{};
  muon.lr = 0.02;
  muon.weight_decay = 0.1;
  muon.momentum = 0.95;
  const muonps_adamw_hyper adamw{1e-3, 0.9, 0.999, 1e-8, 0.0};
  ASSERT_EQ(muonps_client_start(client, &muon, &adamw), MUONPS_OK)
      << muonps_client_last_error(client);
  float* param = nullptr;
  float* grad = nullptr;
  ASSERT_EQ(muonps_client_buffers(client, "b", &param, &grad, nullptr, nullptr,
                                  nullptr),
            MUONPS_OK);
  param[0] = param[1] = 1.0f;
  grad[0] = grad[1] = 0.5f;
  const double lr[] = {0.02, 0.005};
  const double adamw_lr[] = {-1, 0.1};
  const double adamw_wd[] = {-1, 0.5};
  muonps_step_options options{};
  options.lr = -1;
  options.weight_decay = -1;
  options.adamw_lr = -1;
  options.group_count = 2;
  options.group_lr = lr;
  options.group_adamw_lr = adamw_lr;
  options.group_adamw_weight_decay = adamw_wd;
  muonps_step_result result{};
  ASSERT_EQ(muonps_client_step_with(client, 0, &options, &result), MUONPS_OK)
      << muonps_client_last_error(client);
  EXPECT_EQ(result.adamw_applied, 1);
  // torch.optim.AdamW's first step: p (1 - lr wd) - lr g / (|g| + eps).
  EXPECT_NEAR(param[0], 1.0 * (1 - 0.1 * 0.5) - 0.1 * 0.5 / (0.5 + 1e-8), 1e-6);
  const std::vector<muonps::v1::StepRequest> steps = service.steps();
  ASSERT_EQ(steps.size(), 1u);
  ASSERT_EQ(steps[0].groups_size(), 2);
  EXPECT_EQ(steps[0].groups(0).lr(), 0.02);
  EXPECT_EQ(steps[0].groups(0).weight_decay(), -1);  // a NULL array
  EXPECT_EQ(steps[0].groups(0).adamw_lr(), -1);
  EXPECT_EQ(steps[0].groups(1).lr(), 0.005);
  EXPECT_EQ(steps[0].groups(1).adamw_lr(), 0.1);
  EXPECT_EQ(steps[0].groups(1).adamw_weight_decay(), 0.5);
  // A value that is not finite is named before anything is sent.
  const double bad_wd[] = {-1, NAN};
  options.group_adamw_weight_decay = bad_wd;
  EXPECT_EQ(muonps_client_step_with(client, 1, &options, &result),
            MUONPS_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(muonps_client_last_error(client)),
              HasSubstr("groups[1].adamw_weight_decay"));
  EXPECT_EQ(service.steps().size(), 1u);
  muonps_client_destroy(client);
}

TEST(MuonpsCTest, DeclarationErrorsNameTheTensorAndField) {
  muonps_client* client = nullptr;
  ASSERT_EQ(muonps_client_create("127.0.0.1:1", "job", "/tmp/none.sock", 0, 1,
                                 0.5, &client),
            MUONPS_OK);
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(muonps_client_add_matrix(client, "w", 4, 8, 1,
                                     MUONPS_LAYOUT_UNREDUCED, 0),
            MUONPS_OK);
  EXPECT_EQ(muonps_client_add_matrix(client, "w", 4, 8, 1,
                                     MUONPS_LAYOUT_UNREDUCED, 0),
            MUONPS_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(muonps_client_last_error(client)),
              HasSubstr("\"w\""));
  EXPECT_EQ(muonps_client_add_matrix(client, "z", 0, 8, 1,
                                     MUONPS_LAYOUT_REPLICATED, 0),
            MUONPS_INVALID_ARGUMENT);
  EXPECT_EQ(muonps_client_add_matrix(client, "x", 4, 8, 1, 42, 0),
            MUONPS_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(muonps_client_last_error(client)),
              HasSubstr("layout"));
  EXPECT_EQ(muonps_client_add_tensor(client, "b", 8, MUONPS_LAYOUT_ROW_SHARDED),
            MUONPS_INVALID_ARGUMENT);
  EXPECT_EQ(muonps_client_add_tensor(client, "b", 8, MUONPS_LAYOUT_UNREDUCED),
            MUONPS_OK);
  float* param = nullptr;
  EXPECT_EQ(muonps_client_buffers(client, "w", &param, nullptr, nullptr,
                                  nullptr, nullptr),
            MUONPS_FAILED_PRECONDITION);
  EXPECT_EQ(muonps_client_buffers(client, "nope", &param, nullptr, nullptr,
                                  nullptr, nullptr),
            MUONPS_NOT_FOUND);
  EXPECT_EQ(muonps_client_step(client, 0, -1, -1, -1, nullptr),
            MUONPS_FAILED_PRECONDITION);
  EXPECT_THAT(std::string(muonps_client_last_error(client)),
              HasSubstr("Start"));
  // No coordinator listens on port 1: Start fails with a status, not a hang.
  muonps_muon_hyper muon{};
  muon.lr = 0.02;
  muon.weight_decay = 0.1;
  muon.momentum = 0.95;
  muon.nesterov = 1;
  muon.ns_steps = 5;
  muon.adjust_lr_fn = MUONPS_ADJUST_LR_ORIGINAL;
  const muonps_adamw_hyper adamw{1e-3, 0.9, 0.999, 1e-8, 0.0};
  // Hyperparameters are checked before anything is sent.
  muon.ns_algorithm = 9;
  EXPECT_EQ(muonps_client_start(client, &muon, &adamw),
            MUONPS_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(muonps_client_last_error(client)),
              HasSubstr("ns_algorithm"));
  muon.ns_algorithm = MUONPS_NS_AUTO;
  muon.ns_eps = -1;
  EXPECT_EQ(muonps_client_start(client, &muon, &adamw),
            MUONPS_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(muonps_client_last_error(client)), HasSubstr("eps"));
  muon.ns_eps = 0;
  const int code = muonps_client_start(client, &muon, &adamw);
  EXPECT_TRUE(code == MUONPS_UNAVAILABLE || code == MUONPS_DEADLINE_EXCEEDED)
      << code << " " << muonps_client_last_error(client);
  EXPECT_THAT(std::string(muonps_client_last_error(client)),
              HasSubstr("CreateJob"));
  muonps_client_destroy(client);
  muonps_client_destroy(nullptr);
}

}  // namespace

// Found by fuzz/c_abi_fuzzer: a shape whose element count overflows int64
// (signed overflow, undefined behaviour) is refused naming the matrix, as
// are dimensions and element counts past the client's bounds.
TEST(MuonpsCTest, ShapesPastTheBoundsAreRefusedWithoutOverflow) {
  muonps_client* client = nullptr;
  ASSERT_EQ(muonps_client_create("127.0.0.1:1", "job", "/tmp/none.sock", 0, 2,
                                 0.5, &client),
            MUONPS_OK);
  EXPECT_EQ(
      muonps_client_add_matrix(client, "huge", 64, int64_t{720575940379279361},
                               1, MUONPS_LAYOUT_ROW_SHARDED, 0),
      MUONPS_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(muonps_client_last_error(client)),
              HasSubstr("\"huge\""));
  EXPECT_EQ(muonps_client_add_matrix(client, "tall", int64_t{1} << 40, 1, 1,
                                     MUONPS_LAYOUT_ROW_SHARDED, 0),
            MUONPS_INVALID_ARGUMENT);
  EXPECT_EQ(muonps_client_add_matrix(client, "many", 1 << 20, 1 << 20, 2,
                                     MUONPS_LAYOUT_REPLICATED, 0),
            MUONPS_INVALID_ARGUMENT);
  EXPECT_EQ(muonps_client_add_tensor(client, "bias", int64_t{1} << 62,
                                     MUONPS_LAYOUT_UNREDUCED),
            MUONPS_INVALID_ARGUMENT);
  // At the bounds, declarations still succeed (nothing is allocated yet).
  EXPECT_EQ(muonps_client_add_matrix(client, "edge", 1 << 20, 1 << 20, 1,
                                     MUONPS_LAYOUT_ROW_SHARDED, 0),
            MUONPS_OK);
  muonps_client_destroy(client);
}
