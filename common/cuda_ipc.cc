#include "common/cuda_ipc.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"

namespace muonps {
namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == kCudaIpcHandleBytes,
              "cudaIpcMemHandle_t changed size");
static_assert(sizeof(cudaIpcEventHandle_t) == kCudaIpcHandleBytes,
              "cudaIpcEventHandle_t changed size");

// The driver ABI version we ask entry points for. cuMemGetAddressRange_v2
// and cuGetErrorName have been stable since CUDA 3.2 and 6.0; asking for a
// version newer than the installed driver fails, so ask for an old one.
constexpr unsigned int kDriverApiVersion = 12000;

// UNAVAILABLE "<what>: <cudaErrorName>: <text>". Also clears the runtime's
// per-thread last error, so that a later cudaGetLastError() elsewhere (a
// kernel launch check) does not report this call's failure as its own.
absl::Status CudaStatus(cudaError_t e, absl::string_view what) {
  if (e == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();
  return absl::UnavailableError(absl::StrCat(what, ": ", cudaGetErrorName(e),
                                             ": ", cudaGetErrorString(e)));
}

// A driver API function, found through the runtime so that nothing links
// libcuda (the GPU machine's driver provides it at run time). Null when the
// driver lacks it.
template <typename Fn>
absl::StatusOr<Fn> DriverEntryPoint(const char* symbol) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  MUONPS_RETURN_IF_ERROR(CudaStatus(
      cudaGetDriverEntryPointByVersion(symbol, &fn, kDriverApiVersion,
                                       cudaEnableDefault, &found),
      absl::StrCat("cudaGetDriverEntryPointByVersion(", symbol, ")")));
  if (found != cudaDriverEntryPointSuccess || fn == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "the CUDA driver has no ", symbol, " (entry point query result ",
        static_cast<int>(found), ")"));
  }
  return reinterpret_cast<Fn>(fn);
}

std::string DriverErrorText(CUresult result) {
  std::string text = absl::StrCat("CUresult ", static_cast<int>(result));
  absl::StatusOr<PFN_cuGetErrorName_v6000> name_of =
      DriverEntryPoint<PFN_cuGetErrorName_v6000>("cuGetErrorName");
  const char* name = nullptr;
  if (name_of.ok() && (*name_of)(result, &name) == CUDA_SUCCESS &&
      name != nullptr) {
    absl::StrAppend(&text, " (", name, ")");
  }
  return text;
}

// The allocation holding `ptr`, per cuMemGetAddressRange (on the current
// device's context).
struct AddressRange {
  uintptr_t base = 0;
  uint64_t size = 0;
};

absl::StatusOr<AddressRange> AllocationContaining(const void* ptr) {
  MUONPS_ASSIGN_OR_RETURN(
      PFN_cuMemGetAddressRange_v3020 get_range,
      DriverEntryPoint<PFN_cuMemGetAddressRange_v3020>("cuMemGetAddressRange"));
  CUdeviceptr base = 0;
  size_t size = 0;
  const CUresult result =
      get_range(&base, &size, reinterpret_cast<CUdeviceptr>(ptr));
  if (result != CUDA_SUCCESS) {
    return absl::UnavailableError(absl::StrFormat(
        "cuMemGetAddressRange(%p): %s", ptr, DriverErrorText(result)));
  }
  return AddressRange{static_cast<uintptr_t>(base), size};
}

absl::Status CheckDevice(int device) {
  int count = 0;
  MUONPS_RETURN_IF_ERROR(
      CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
  if (device < 0 || device >= count) {
    return InvalidField("device", absl::StrCat(device, ": this process sees ",
                                               count, " CUDA device(s)"));
  }
  return absl::OkStatus();
}

// Runs `body` with `device` current on this thread, then restores the
// thread's previous current device. `body` returns a Status or StatusOr.
// cudaSetDevice runs even when `device` is already the current one: it also
// makes the device's primary context current on this thread, which the
// driver calls (cuMemGetAddressRange) need and a fresh thread lacks.
template <typename Body>
auto OnDevice(int device, Body&& body) -> decltype(body()) {
  int previous = 0;
  MUONPS_RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&previous), "cudaGetDevice"));
  MUONPS_RETURN_IF_ERROR(CudaStatus(
      cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")")));
  auto result = body();
  if (previous != device) (void)cudaSetDevice(previous);
  return result;
}

}  // namespace

absl::StatusOr<IpcMemoryRef> ExportDeviceMemory(const void* ptr,
                                                uint64_t bytes) {
  if (ptr == nullptr) return InvalidField("ptr", "is null");
  if (reinterpret_cast<uintptr_t>(ptr) % 4 != 0) {
    return InvalidField("ptr",
                        absl::StrFormat("%p: is not 4-byte aligned", ptr));
  }
  if (bytes == 0) return InvalidField("bytes", "must be > 0");

  cudaPointerAttributes attributes;
  std::memset(&attributes, 0, sizeof(attributes));
  const cudaError_t e = cudaPointerGetAttributes(&attributes, ptr);
  if (e == cudaErrorInvalidValue) {
    // Older runtimes answer this way for memory CUDA does not know.
    (void)cudaGetLastError();
    attributes.type = cudaMemoryTypeUnregistered;
  } else {
    MUONPS_RETURN_IF_ERROR(
        CudaStatus(e, absl::StrFormat("cudaPointerGetAttributes(%p)", ptr)));
  }
  if (attributes.type != cudaMemoryTypeDevice) {
    const char* kind = attributes.type == cudaMemoryTypeHost ? "pinned host"
                       : attributes.type == cudaMemoryTypeManaged
                           ? "managed"
                           : "unregistered host";
    return InvalidField(
        "ptr", absl::StrFormat("%p: is not device memory (cudaMalloc'd); "
                               "CUDA reports %s memory",
                               ptr, kind));
  }
  const int device = attributes.device;

  return OnDevice(device, [&]() -> absl::StatusOr<IpcMemoryRef> {
    MUONPS_ASSIGN_OR_RETURN(const AddressRange allocation,
                            AllocationContaining(ptr));
    const uintptr_t address = reinterpret_cast<uintptr_t>(ptr);
    if (address < allocation.base ||
        address - allocation.base >= allocation.size) {
      // cuMemGetAddressRange answered for an allocation not holding ptr.
      return absl::UnavailableError(absl::StrFormat(
          "cuMemGetAddressRange(%p) gave [0x%x, +%d), which does not hold it",
          ptr, allocation.base, allocation.size));
    }
    const uint64_t offset = address - allocation.base;
    if (bytes > allocation.size - offset) {
      return InvalidField(
          "bytes", absl::StrFormat("%d bytes from %p run past the end of its "
                                   "allocation [0x%x, +%d) by %d bytes",
                                   bytes, ptr, allocation.base, allocation.size,
                                   bytes - (allocation.size - offset)));
    }
    cudaIpcMemHandle_t handle;
    MUONPS_RETURN_IF_ERROR(CudaStatus(
        cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(allocation.base)),
        absl::StrFormat("cudaIpcGetMemHandle(0x%x, the allocation of %p)",
                        allocation.base, ptr)));
    IpcMemoryRef ref;
    ref.handle.assign(handle.reserved, kCudaIpcHandleBytes);
    ref.offset = offset;
    ref.bytes = bytes;
    ref.device = device;
    return ref;
  });
}

IpcMemoryMap::IpcMemoryMap(IpcMemoryMap&& other) noexcept
    : mappings_(std::move(other.mappings_)) {
  other.mappings_.clear();
}

IpcMemoryMap& IpcMemoryMap::operator=(IpcMemoryMap&& other) noexcept {
  if (this != &other) {
    CloseAll();
    mappings_ = std::move(other.mappings_);
    other.mappings_.clear();
  }
  return *this;
}

IpcMemoryMap::~IpcMemoryMap() { CloseAll(); }

void IpcMemoryMap::CloseAll() {
  for (auto& [handle, mapping] : mappings_) {
    const void* base = mapping.base;
    (void)OnDevice(mapping.device, [base]() {
      return CudaStatus(cudaIpcCloseMemHandle(const_cast<void*>(base)),
                        "cudaIpcCloseMemHandle");
    });
  }
  mappings_.clear();
}

absl::StatusOr<void*> IpcMemoryMap::Open(const IpcMemoryRef& ref) {
  if (ref.handle.size() != kCudaIpcHandleBytes) {
    return InvalidField(
        "handle",
        absl::StrCat("has ", ref.handle.size(),
                     " bytes; a cudaIpcMemHandle_t has ", kCudaIpcHandleBytes));
  }
  if (ref.offset % 4 != 0) {
    return InvalidField("offset",
                        absl::StrCat(ref.offset, ": is not 4-byte aligned"));
  }
  if (ref.bytes == 0) return InvalidField("bytes", "must be > 0");
  if (ref.bytes > UINT64_MAX - ref.offset) {
    return InvalidField("bytes", absl::StrCat(ref.bytes, " from offset ",
                                              ref.offset, " overflow"));
  }
  MUONPS_RETURN_IF_ERROR(CheckDevice(ref.device));
  auto fits = [&ref](const Mapping& mapping) -> absl::Status {
    if (mapping.size != 0 && ref.offset + ref.bytes > mapping.size) {
      return InvalidField(
          "bytes", absl::StrCat("[", ref.offset, ", ", ref.offset + ref.bytes,
                                ") runs past the end of the lent allocation (",
                                mapping.size, " bytes)"));
    }
    return absl::OkStatus();
  };

  auto it = mappings_.find(ref.handle);
  if (it != mappings_.end()) {
    Mapping& mapping = it->second;
    if (mapping.device != ref.device) {
      return InvalidField(
          "handle", absl::StrCat("is open here on device ", mapping.device,
                                 ", not device ", ref.device));
    }
    MUONPS_RETURN_IF_ERROR(fits(mapping));
    ++mapping.uses;
    return static_cast<char*>(mapping.base) + ref.offset;
  }

  cudaIpcMemHandle_t handle;
  std::memcpy(handle.reserved, ref.handle.data(), kCudaIpcHandleBytes);
  MUONPS_ASSIGN_OR_RETURN(
      Mapping mapping, OnDevice(ref.device, [&]() -> absl::StatusOr<Mapping> {
        Mapping opened;
        opened.device = ref.device;
        MUONPS_RETURN_IF_ERROR(CudaStatus(
            cudaIpcOpenMemHandle(&opened.base, handle,
                                 cudaIpcMemLazyEnablePeerAccess),
            absl::StrCat("cudaIpcOpenMemHandle on device ", ref.device)));
        // The mapping covers the exporter's whole allocation. If the driver
        // will not say how big it is, the range check is left to the
        // exporter's (ExportDeviceMemory checked it).
        absl::StatusOr<AddressRange> range = AllocationContaining(opened.base);
        if (range.ok() &&
            range->base == reinterpret_cast<uintptr_t>(opened.base)) {
          opened.size = range->size;
        }
        absl::Status fit = fits(opened);
        if (!fit.ok()) {
          (void)cudaIpcCloseMemHandle(opened.base);
          return fit;
        }
        return opened;
      }));
  mapping.uses = 1;
  void* base = mapping.base;
  mappings_.emplace(ref.handle, mapping);
  return static_cast<char*>(base) + ref.offset;
}

absl::Status IpcMemoryMap::Close(const IpcMemoryRef& ref) {
  auto it = mappings_.find(ref.handle);
  if (it == mappings_.end()) {
    return absl::NotFoundError("handle: is not open in this IpcMemoryMap");
  }
  if (--it->second.uses > 0) return absl::OkStatus();
  const Mapping mapping = it->second;
  mappings_.erase(it);
  return OnDevice(mapping.device, [&mapping]() {
    return CudaStatus(cudaIpcCloseMemHandle(mapping.base),
                      "cudaIpcCloseMemHandle");
  });
}

absl::StatusOr<IpcEvent> IpcEvent::Create(int device) {
  MUONPS_RETURN_IF_ERROR(CheckDevice(device));
  return OnDevice(device, [device]() -> absl::StatusOr<IpcEvent> {
    cudaEvent_t event = nullptr;
    MUONPS_RETURN_IF_ERROR(CudaStatus(
        cudaEventCreateWithFlags(
            &event, cudaEventDisableTiming | cudaEventInterprocess),
        absl::StrCat("cudaEventCreateWithFlags(interprocess) on device ",
                     device)));
    return IpcEvent(event, device);
  });
}

absl::StatusOr<IpcEvent> IpcEvent::Open(const std::string& handle, int device) {
  if (handle.size() != kCudaIpcHandleBytes) {
    return InvalidField("handle",
                        absl::StrCat("has ", handle.size(),
                                     " bytes; a cudaIpcEventHandle_t has ",
                                     kCudaIpcHandleBytes));
  }
  MUONPS_RETURN_IF_ERROR(CheckDevice(device));
  cudaIpcEventHandle_t raw;
  std::memcpy(raw.reserved, handle.data(), kCudaIpcHandleBytes);
  return OnDevice(device, [&]() -> absl::StatusOr<IpcEvent> {
    cudaEvent_t event = nullptr;
    MUONPS_RETURN_IF_ERROR(
        CudaStatus(cudaIpcOpenEventHandle(&event, raw),
                   absl::StrCat("cudaIpcOpenEventHandle on device ", device)));
    return IpcEvent(event, device);
  });
}

IpcEvent::IpcEvent(IpcEvent&& other) noexcept
    : event_(std::exchange(other.event_, nullptr)), device_(other.device_) {}

IpcEvent& IpcEvent::operator=(IpcEvent&& other) noexcept {
  if (this != &other) {
    Destroy();
    event_ = std::exchange(other.event_, nullptr);
    device_ = other.device_;
  }
  return *this;
}

IpcEvent::~IpcEvent() { Destroy(); }

void IpcEvent::Destroy() {
  if (event_ != nullptr) {
    (void)cudaEventDestroy(event_);
    event_ = nullptr;
  }
}

absl::Status IpcEvent::CheckNotEmpty() const {
  if (event_ == nullptr) {
    return absl::FailedPreconditionError("IpcEvent: is empty (moved from)");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> IpcEvent::Export() const {
  MUONPS_RETURN_IF_ERROR(CheckNotEmpty());
  cudaIpcEventHandle_t handle;
  MUONPS_RETURN_IF_ERROR(CudaStatus(cudaIpcGetEventHandle(&handle, event_),
                                    "cudaIpcGetEventHandle"));
  return std::string(handle.reserved, kCudaIpcHandleBytes);
}

absl::Status IpcEvent::Record(Stream stream) {
  MUONPS_RETURN_IF_ERROR(CheckNotEmpty());
  // The device matters for kHostStream (that device's default stream).
  return OnDevice(device_, [&]() {
    return CudaStatus(cudaEventRecord(event_, stream),
                      absl::StrFormat("cudaEventRecord(stream %p)", stream));
  });
}

absl::Status IpcEvent::MakeStreamWait(Stream stream) {
  MUONPS_RETURN_IF_ERROR(CheckNotEmpty());
  return OnDevice(device_, [&]() {
    return CudaStatus(
        cudaStreamWaitEvent(stream, event_, 0),
        absl::StrFormat("cudaStreamWaitEvent(stream %p)", stream));
  });
}

absl::Status IpcEvent::Synchronize() {
  MUONPS_RETURN_IF_ERROR(CheckNotEmpty());
  return CudaStatus(cudaEventSynchronize(event_), "cudaEventSynchronize");
}

absl::StatusOr<bool> IpcEvent::Done() {
  MUONPS_RETURN_IF_ERROR(CheckNotEmpty());
  const cudaError_t e = cudaEventQuery(event_);
  if (e == cudaErrorNotReady) return false;
  MUONPS_RETURN_IF_ERROR(CudaStatus(e, "cudaEventQuery"));
  return true;
}

absl::Status StreamWaitAtLeast(Stream stream, const void* device_address,
                               uint64_t value) {
  MUONPS_ASSIGN_OR_RETURN(
      PFN_cuStreamWaitValue64_v11070 wait,
      DriverEntryPoint<PFN_cuStreamWaitValue64_v11070>("cuStreamWaitValue64"));
  const CUresult result = wait(reinterpret_cast<CUstream>(stream),
                               reinterpret_cast<CUdeviceptr>(device_address),
                               value, CU_STREAM_WAIT_VALUE_GEQ);
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("cuStreamWaitValue64: ", DriverErrorText(result)));
}

absl::Status StreamWriteValue(Stream stream, void* device_address,
                              uint64_t value) {
  MUONPS_ASSIGN_OR_RETURN(PFN_cuStreamWriteValue64_v11070 write,
                          DriverEntryPoint<PFN_cuStreamWriteValue64_v11070>(
                              "cuStreamWriteValue64"));
  const CUresult result = write(reinterpret_cast<CUstream>(stream),
                                reinterpret_cast<CUdeviceptr>(device_address),
                                value, CU_STREAM_WRITE_VALUE_DEFAULT);
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("cuStreamWriteValue64: ", DriverErrorText(result)));
}

}  // namespace muonps
