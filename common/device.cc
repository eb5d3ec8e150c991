#include "common/device.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status.h"

namespace muonps {

std::string DeviceName(const Device& device) {
  return device.is_cuda() ? absl::StrCat("cuda:", device.ordinal) : "cpu";
}

absl::StatusOr<Device> ParseDevice(absl::string_view text) {
  if (text == "cpu") return kHostDevice;
  if (text == "cuda") return Device{MemoryKind::kCuda, 0};
  int ordinal = -1;
  if (absl::ConsumePrefix(&text, "cuda:") && absl::SimpleAtoi(text, &ordinal) &&
      ordinal >= 0 && ordinal < 1024) {
    return Device{MemoryKind::kCuda, ordinal};
  }
  return InvalidField(
      "device", absl::StrCat(Quoted(text), " is not cpu, cuda or cuda:N"));
}

}  // namespace muonps
