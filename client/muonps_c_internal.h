// What the C ABI's source files share (muonps_c.cc: handles and errors;
// muonps_c_setup.cc: declarations, groups and start; muonps_c_step.cc:
// steps; muonps_c_state.cc: momentum, AdamW state and checkpoints): the
// handle behind the opaque muonps_client and the helper that records a
// call's status on it. Private to the muonps_c target; not part of the ABI.
#ifndef MUONPS_CLIENT_MUONPS_C_INTERNAL_H_
#define MUONPS_CLIENT_MUONPS_C_INTERNAL_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "client/client.h"
#include "client/muonps_c.h"

struct muonps_client {
  std::unique_ptr<muonps::Client> client;
  std::string last_error;
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
