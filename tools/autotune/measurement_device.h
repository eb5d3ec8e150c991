// The device a MuonKernels backend runs on, as far as timing it needs: memory
// the kernels can read and write, a way to fill it from the host, and a
// barrier that waits for queued work. The autotuner is written against this
// interface so that it runs, and is tested, on the CPU backend with host
// memory exactly as it runs on the GPU with device memory.
//
// A MeasurementDevice is not safe for concurrent use; it is used by the one
// thread that drives its kernels.
#ifndef MUONPS_TOOLS_AUTOTUNE_MEASUREMENT_DEVICE_H_
#define MUONPS_TOOLS_AUTOTUNE_MEASUREMENT_DEVICE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace muonps {
namespace autotune {

class MeasurementDevice {
 public:
  MeasurementDevice() = default;
  MeasurementDevice(const MeasurementDevice&) = delete;
  MeasurementDevice& operator=(const MeasurementDevice&) = delete;
  virtual ~MeasurementDevice() = default;

  // What the cost table's {"device": ...} line says, e.g. "NVIDIA H200".
  virtual std::string name() const = 0;

  // Allocates `count` (> 0) floats the kernels can use. The caller owns the
  // memory and returns it with Free. RESOURCE_EXHAUSTED naming the size when
  // the device has too little memory.
  virtual absl::StatusOr<float*> Allocate(int64_t count) = 0;

  // Returns memory from Allocate; nullptr is ignored.
  virtual void Free(float* data) = 0;

  // Copies `host` into the device memory starting at `device`, which must
  // hold at least host.size() floats. Returns when the copy is done.
  virtual absl::Status CopyFromHost(absl::Span<const float> host,
                                    float* device) = 0;

  // Returns once every operation queued by the kernels has finished;
  // INTERNAL with the device's error if one of them failed.
  virtual absl::Status Synchronize() = 0;
};

// Memory from Allocate, returned to its device on destruction. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Allocates `count` floats on `device`, which must outlive the buffer.
  static absl::StatusOr<DeviceBuffer> Allocate(MeasurementDevice& device,
                                               int64_t count);
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  ~DeviceBuffer();

  float* data() const { return data_; }
  int64_t size() const { return size_; }

 private:
  DeviceBuffer(MeasurementDevice* device, float* data, int64_t size)
      : device_(device), data_(data), size_(size) {}

  MeasurementDevice* device_ = nullptr;
  float* data_ = nullptr;
  int64_t size_ = 0;
};

// The CPU backend's device: host memory (64-byte aligned), synchronous
// kernels. Its name is the processor's model name from /proc/cpuinfo (or
// "cpu"), with the thread count appended when `threads` > 0.
class HostMeasurementDevice final : public MeasurementDevice {
 public:
  explicit HostMeasurementDevice(int threads = 0);

  std::string name() const override { return name_; }
  absl::StatusOr<float*> Allocate(int64_t count) override;
  void Free(float* data) override;
  absl::Status CopyFromHost(absl::Span<const float> host,
                            float* device) override;
  absl::Status Synchronize() override { return absl::OkStatus(); }

 private:
  std::string name_;
};

}  // namespace autotune
}  // namespace muonps

#endif  // MUONPS_TOOLS_AUTOTUNE_MEASUREMENT_DEVICE_H_
