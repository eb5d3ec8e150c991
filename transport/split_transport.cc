#include "transport/split_transport.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace muonps {
namespace transport {

absl::StatusOr<std::unique_ptr<SplitTransport>> SplitTransport::Create(
    std::unique_ptr<Transport> data, std::unique_ptr<Transport> control) {
  if (data == nullptr || control == nullptr) {
    return absl::InvalidArgumentError(
        "a split transport needs a data and a control transport");
  }
  if (control->memory() != MemoryKind::kHost) {
    return absl::InvalidArgumentError(
        "a split transport's control transport must move host memory");
  }
  if (data->rank() != control->rank() || data->size() != control->size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "split transport: data rank ", data->rank(), " of ", data->size(),
        ", control rank ", control->rank(), " of ", control->size()));
  }
  return std::unique_ptr<SplitTransport>(
      new SplitTransport(std::move(data), std::move(control)));
}

}  // namespace transport
}  // namespace muonps
