#include "tools/autotune/measurement_device.h"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status.h"

namespace muonps {
namespace autotune {
namespace {

std::string ProcessorName() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    absl::string_view view(line);
    if (!absl::ConsumePrefix(&view, "model name")) continue;
    const size_t colon = view.find(':');
    if (colon == absl::string_view::npos) continue;
    const absl::string_view name =
        absl::StripAsciiWhitespace(view.substr(colon + 1));
    if (!name.empty()) return std::string(name);
  }
  return "cpu";
}

}  // namespace

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(MeasurementDevice& device,
                                                    int64_t count) {
  MUONPS_ASSIGN_OR_RETURN(float* data, device.Allocate(count));
  return DeviceBuffer(&device, data, count);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : device_(std::exchange(other.device_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (device_ != nullptr) device_->Free(data_);
    device_ = std::exchange(other.device_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (device_ != nullptr) device_->Free(data_);
}

HostMeasurementDevice::HostMeasurementDevice(int threads)
    : name_(ProcessorName()) {
  if (threads > 0) absl::StrAppend(&name_, " (", threads, " threads)");
}

absl::StatusOr<float*> HostMeasurementDevice::Allocate(int64_t count) {
  if (count <= 0) {
    return InvalidField("count", absl::StrCat(count, " must be > 0"));
  }
  constexpr size_t kAlignment = 64;
  size_t bytes = static_cast<size_t>(count) * sizeof(float);
  bytes = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  void* data = std::aligned_alloc(kAlignment, bytes);
  if (data == nullptr) {
    return FieldError(absl::StatusCode::kResourceExhausted, "count",
                      absl::StrCat("cannot allocate ", bytes, " bytes"));
  }
  return static_cast<float*>(data);
}

void HostMeasurementDevice::Free(float* data) { std::free(data); }

absl::Status HostMeasurementDevice::CopyFromHost(absl::Span<const float> host,
                                                 float* device) {
  if (device == nullptr) return InvalidField("device", "is null");
  std::memcpy(device, host.data(), host.size() * sizeof(float));
  return absl::OkStatus();
}

}  // namespace autotune
}  // namespace muonps
