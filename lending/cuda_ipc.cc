// Lending device memory between processes: ExportDeviceMemory on the
// exporting side and IpcMemoryMap on the importing one. IpcEvent and the
// stream memory operations are in cuda_ipc_sync.cc.
#include "lending/cuda_ipc.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/cuda_device.h"
#include "common/cuda_status.h"
#include "common/status.h"
#include "lending/cuda_ipc_internal.h"

namespace muonps {
namespace {

using cuda_ipc_internal::CheckDevice;
using cuda_ipc_internal::DriverEntryPoint;
using cuda_ipc_internal::DriverErrorText;

static_assert(sizeof(cudaIpcMemHandle_t) == kCudaIpcHandleBytes,
              "cudaIpcMemHandle_t changed size");

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

}  // namespace muonps
