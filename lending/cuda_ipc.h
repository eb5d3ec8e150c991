// CUDA IPC: lending device memory and events between processes on one host.
//
// A trainer lends its gradient and parameter buffers to the worker daemon on
// its own GPU (NCCL refuses two ranks on one GPU, so the trainer never joins
// NCCL; docs/architecture.md, "On a GPU"). The trainer calls
// ExportDeviceMemory() for each buffer and sends the IpcMemoryRef over its
// control socket; the worker opens the refs with an IpcMemoryMap and reads and
// writes the trainer's memory in place. An IpcEvent orders the two processes'
// streams without a host sync: the trainer records after backward, the worker's
// stream waits on it, and the other way round for "the step is applied".
// This is the device twin of lending/shared_memory.h.
//
// Ownership and lifetime:
//   - The exporter keeps the memory allocated (no cudaFree, and no return of
//     the block to a caching allocator that might hand it out again) for as
//     long as any importer uses it; freeing memory another process still has
//     open is undefined behaviour in CUDA.
//   - An IpcMemoryMap owns the mappings it opened and closes them
//     (cudaIpcCloseMemHandle) in Close() or its destructor; pointers it
//     returned are invalid afterwards.
//   - An IpcEvent owns its cudaEvent_t and destroys it with itself. The
//     creating process's event must outlive every opened copy of it.
//   - A handle cannot be opened in the process that exported it (CUDA
//     refuses); export in one process, open in another.
//
// What can be lent: memory from cudaMalloc (or cuMemAlloc), including a
// pointer into the middle of such an allocation, which is what PyTorch's
// caching allocator hands out: the whole allocation is lent and the ref
// carries the pointer's offset in it. Memory from stream-ordered pools
// (cudaMallocAsync) or the virtual memory API (cuMemCreate; PyTorch's
// expandable_segments) has no cudaIpcMemHandle: export fails with CUDA's
// error.
//
// Device selection: calls that need a device make it current for their own
// duration and restore the calling thread's previous current device.
//
// Thread-safety: thread-compatible. Distinct objects may be used from
// different threads; one IpcMemoryMap or IpcEvent needs external
// synchronization if any thread moves, destroys or (IpcMemoryMap) opens or
// closes through it while others use it. ExportDeviceMemory is thread-safe.
//
// Errors: INVALID_ARGUMENT naming the argument for bad input (a pointer that
// is not device memory, a range outside its allocation, misalignment, a
// malformed handle, a device ordinal out of range); FAILED_PRECONDITION for
// a moved-from IpcEvent; NOT_FOUND for closing what is not open. When CUDA
// itself refuses, its error as common/cuda_status.h maps it (out of memory
// RESOURCE_EXHAUSTED, a bad value or handle INVALID_ARGUMENT, IPC or peer
// access unsupported FAILED_PRECONDITION, no usable device UNAVAILABLE, the
// rest INTERNAL), the message naming the call and the CUDA error.
#ifndef MUONPS_LENDING_CUDA_IPC_H_
#define MUONPS_LENDING_CUDA_IPC_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/device.h"

// The CUDA runtime's event type is `CUevent_st*` (cudaEvent_t); naming the
// struct keeps CUDA headers out of this header, as device.h does for streams.
struct CUevent_st;

namespace muonps {

// Bytes of a cudaIpcMemHandle_t and of a cudaIpcEventHandle_t.
inline constexpr size_t kCudaIpcHandleBytes = 64;

// Everything another process needs to open a lent buffer: the allocation's
// handle and where the buffer lies in it.
struct IpcMemoryRef {
  // The cudaIpcMemHandle_t of the whole allocation (kCudaIpcHandleBytes
  // raw bytes, not text).
  std::string handle;
  // Offset of the lent pointer from the allocation's base.
  uint64_t offset = 0;
  // Bytes lent from `offset` on.
  uint64_t bytes = 0;
  // CUDA device ordinal the memory lives on, as the exporter numbers its
  // devices (CUDA_VISIBLE_DEVICES must agree between the two processes).
  int device = 0;
};

// Lends [ptr, ptr + bytes). `ptr` may point into an allocation; the ref
// names the allocation's handle and ptr's offset in it. Does not take
// ownership; see "Ownership and lifetime" above for how long the memory must
// stay allocated. Fails with INVALID_ARGUMENT naming "ptr" when ptr is null,
// not 4-byte aligned, or not device memory (host, pinned host and managed
// memory are refused), naming "bytes" when bytes is 0 or the range runs past
// the end of ptr's allocation; CUDA's error when CUDA fails (including
// memory that has no IPC handle, such as cudaMallocAsync pools).
absl::StatusOr<IpcMemoryRef> ExportDeviceMemory(const void* ptr,
                                                uint64_t bytes);

// The importing side: opens IpcMemoryRefs from other processes and owns the
// mappings. Each distinct handle is mapped once, however many refs into its
// allocation are opened; Open() and Close() count the uses of each mapping.
class IpcMemoryMap {
 public:
  IpcMemoryMap() = default;

  // Moving transfers every mapping; the moved-from map is empty. Assigning
  // over a map first closes the mappings it held.
  IpcMemoryMap(IpcMemoryMap&& other) noexcept;
  IpcMemoryMap& operator=(IpcMemoryMap&& other) noexcept;

  // A mapping has exactly one object that closes it.
  IpcMemoryMap(const IpcMemoryMap&) = delete;
  IpcMemoryMap& operator=(const IpcMemoryMap&) = delete;

  // Closes every mapping, whatever its count of uses. Errors from CUDA are
  // ignored (nothing to report them to; the process may be exiting).
  ~IpcMemoryMap();

  // Returns a pointer to ref's buffer (the mapping's base + ref.offset),
  // valid on device ref.device until the mapping is closed. Maps the handle
  // with cudaIpcOpenMemHandle (peer access enabled lazily) on ref.device the
  // first time it is seen, and reuses that mapping after. Where CUDA reports
  // the mapped allocation's size, a range past its end is refused.
  // Fails with INVALID_ARGUMENT naming "handle" (not kCudaIpcHandleBytes
  // bytes, or already open here on another device), "offset" (not 4-byte
  // aligned), "bytes" (0, or past the end of the allocation) or "device"
  // (no such device); CUDA's error when CUDA cannot open the handle (it was
  // exported by this same process, the exporter freed the memory or exited,
  // or the devices cannot reach each other). A failed Open changes nothing.
  absl::StatusOr<void*> Open(const IpcMemoryRef& ref);

  // Undoes one successful Open of ref's handle; the mapping is closed when
  // the last one is undone, invalidating the pointers into it. NOT_FOUND
  // when the handle is not open in this map; CUDA's error when CUDA fails
  // to close it (the map forgets it either way).
  absl::Status Close(const IpcMemoryRef& ref);

  // Distinct handles currently mapped.
  size_t open_mappings() const { return mappings_.size(); }

 private:
  struct Mapping {
    void* base = nullptr;
    // Bytes of the mapped allocation; 0 where CUDA did not say.
    uint64_t size = 0;
    int device = 0;
    // Successful Opens not yet undone by Close.
    int uses = 0;
  };

  void CloseAll();

  // Keyed by the handle's bytes.
  absl::flat_hash_map<std::string, Mapping> mappings_;
};

// An interprocess CUDA event (timing disabled, as CUDA requires for IPC).
// The creating process Export()s it and another process Open()s the handle;
// both may then record on it and make streams wait on it. A stream waits for
// the most recent Record() issued, in whichever process, before its wait was
// enqueued.
class IpcEvent {
 public:
  // Creates an event on `device`. INVALID_ARGUMENT naming "device" for a
  // device that does not exist; CUDA's error when CUDA fails.
  static absl::StatusOr<IpcEvent> Create(int device);

  // Opens an event another process created and exported, for use on
  // `device` (the creator's device, as this process numbers it).
  // INVALID_ARGUMENT naming "handle" when it is not kCudaIpcHandleBytes
  // bytes, or "device"; CUDA's error when CUDA cannot open it (for example,
  // it was exported by this process).
  static absl::StatusOr<IpcEvent> Open(const std::string& handle, int device);

  // Moving transfers the event; the moved-from object is empty (every call
  // on it is FAILED_PRECONDITION) and destroys nothing. Assigning over an
  // event first destroys the one it held.
  IpcEvent(IpcEvent&& other) noexcept;
  IpcEvent& operator=(IpcEvent&& other) noexcept;
  IpcEvent(const IpcEvent&) = delete;
  IpcEvent& operator=(const IpcEvent&) = delete;

  // Destroys this process's event (cudaEventDestroy). A creator's
  // destruction leaves opened copies in other processes undefined.
  ~IpcEvent();

  // The cudaIpcEventHandle_t bytes (kCudaIpcHandleBytes) to send to the
  // process that will Open() it. CUDA's error when CUDA fails.
  absl::StatusOr<std::string> Export() const;

  // Records the event after the work enqueued so far on `stream` (a stream
  // of device(); kHostStream is that device's legacy default stream).
  // Returns once enqueued. CUDA's error when CUDA fails.
  absl::Status Record(Stream stream);

  // Makes later work on `stream` wait until the last recorded work of the
  // event is done; returns at once, with no host sync. CUDA's error when
  // CUDA fails.
  absl::Status MakeStreamWait(Stream stream);

  // Blocks the host until the last recorded work is done (at once if the
  // event was never recorded). CUDA's error when CUDA fails, including a
  // failure of the work itself.
  absl::Status Synchronize();

  // Whether the last recorded work is done (true for a never-recorded
  // event). CUDA's error when CUDA fails.
  absl::StatusOr<bool> Done();

  // Device the event belongs to.
  int device() const { return device_; }

 private:
  IpcEvent(CUevent_st* event, int device) : event_(event), device_(device) {}

  absl::Status CheckNotEmpty() const;
  void Destroy();

  CUevent_st* event_ = nullptr;
  int device_ = 0;
};

// A step counter shared between a trainer and its worker: one 64-bit word
// of device memory (the trainer's, lent to the worker like a buffer) that
// streams wait on and write, so neither side's host waits for the other
// (CUDA stream memory operations; cuStreamWaitValue64/WriteValue64).

// Makes `stream` wait until the 64-bit word at `device_address` is >=
// `value`. UNAVAILABLE when the driver lacks 64-bit stream memory ops.
absl::Status StreamWaitAtLeast(Stream stream, const void* device_address,
                               uint64_t value);

// Enqueues the write of `value` to the word at `device_address` after the
// work enqueued so far on `stream` (with a memory barrier: that work's
// writes are visible to whoever sees the value).
absl::Status StreamWriteValue(Stream stream, void* device_address,
                              uint64_t value);

}  // namespace muonps

#endif  // MUONPS_LENDING_CUDA_IPC_H_
