// What the C ABI's two source files (muonps_c.cc: handles, registration and
// start; muonps_c_step.cc: steps, checkpoints and optimizer state) share:
// the handle behind the opaque muonps_client and the helper that records a
// call's status on it. Private to the muonps_c target; not part of the ABI.
#ifndef MUONPS_CLIENT_MUONPS_C_INTERNAL_H_
#define MUONPS_CLIENT_MUONPS_C_INTERNAL_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/client.h"
#include "client/muonps_c.h"

struct muonps_client {
  std::unique_ptr<muonps::Client> client;
  std::string last_error;
  // muonps_client_set_group's groups, by index.
  std::vector<std::vector<std::string>> groups;
};

namespace muonps {
namespace client_internal {

// Keeps `status`'s message as the handle's last error (empty when OK) and
// returns its code.
inline int Record(muonps_client* c, const absl::Status& status) {
  c->last_error = status.ok() ? "" : std::string(status.message());
  return static_cast<int>(status.code());
}

}  // namespace client_internal
}  // namespace muonps

#endif  // MUONPS_CLIENT_MUONPS_C_INTERNAL_H_
