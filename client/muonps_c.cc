// The C ABI's version, handles and error messages (muonps_c.h). The calls
// before and at start are in muonps_c_setup.cc, steps in muonps_c_step.cc,
// momentum, AdamW state and checkpoints in muonps_c_state.cc.
#include "client/muonps_c.h"

#include <memory>
#include <string>

#include "client/client.h"
#include "client/muonps_c_internal.h"

namespace {

// Per-thread: the message of the last failed muonps_client_create.
thread_local std::string create_error;

}  // namespace

extern "C" {

#define MUONPS_C_STRINGIFY_(x) #x
#define MUONPS_C_STRINGIFY(x) MUONPS_C_STRINGIFY_(x)

const char* muonps_version(void) {
  return "muonps 0.2.0 (C ABI " MUONPS_C_STRINGIFY(MUONPS_C_ABI_VERSION) ")";
}
int muonps_abi_version(void) { return MUONPS_C_ABI_VERSION; }

int muonps_client_create(const char* coordinator, const char* job,
                         const char* worker_socket, int trainer_rank,
                         int trainer_count, double timeout_seconds,
                         muonps_client** out) {
  return muonps_client_create_on(coordinator, job, worker_socket, trainer_rank,
                                 trainer_count, timeout_seconds, "cpu", out);
}

int muonps_client_create_on(const char* coordinator, const char* job,
                            const char* worker_socket, int trainer_rank,
                            int trainer_count, double timeout_seconds,
                            const char* device, muonps_client** out) {
  if (out == nullptr) return MUONPS_INVALID_ARGUMENT;
  *out = nullptr;
  if (coordinator == nullptr || job == nullptr || worker_socket == nullptr) {
    create_error = "coordinator, job and worker_socket must not be NULL";
    return MUONPS_INVALID_ARGUMENT;
  }
  muonps::ClientOptions options;
  options.coordinator = coordinator;
  options.job = job;
  options.worker_socket = worker_socket;
  options.trainer_rank = trainer_rank;
  options.trainer_count = trainer_count;
  if (timeout_seconds > 0) options.timeout = absl::Seconds(timeout_seconds);
  options.device = device == nullptr ? "cpu" : device;
  absl::StatusOr<std::unique_ptr<muonps::Client>> client =
      muonps::Client::Create(options);
  if (!client.ok()) {
    create_error = std::string(client.status().message());
    return static_cast<int>(client.status().code());
  }
  *out = new muonps_client{*std::move(client), ""};
  return MUONPS_OK;
}

const char* muonps_last_create_error(void) { return create_error.c_str(); }

void muonps_client_destroy(muonps_client* client) { delete client; }

const char* muonps_client_last_error(const muonps_client* client) {
  return client == nullptr ? "client is NULL" : client->last_error.c_str();
}

}  // extern "C"
