#include "proto/grpc_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace muonps {

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

absl::Status FromGrpc(const grpc::Status& status, absl::string_view what) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      what.empty()
                          ? status.error_message()
                          : absl::StrCat(what, ": ", status.error_message()));
}

std::chrono::system_clock::time_point DeadlineIn(absl::Duration timeout) {
  return std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout);
}

}  // namespace muonps
