#include "lending/cuda_ipc_gpu_test_child.h"

#include <cstddef>
#include <cstring>
#include <iostream>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace muonps {
namespace ipc_test {

uint32_t Pattern(uint64_t i) {
  return static_cast<uint32_t>((i + 1) * 2654435761u);
}
uint32_t ChildPattern(uint64_t i) { return ~Pattern(i); }

absl::Status Fill(void* at, uint64_t first, uint64_t words,
                  uint32_t (*pattern)(uint64_t)) {
  std::vector<uint32_t> host(words);
  for (uint64_t i = 0; i < words; ++i) host[i] = pattern(first + i);
  MUONPS_RETURN_IF_ERROR(
      CudaStatus(cudaMemcpy(at, host.data(), words * 4, cudaMemcpyHostToDevice),
                 "cudaMemcpy to device"));
  return CudaStatus(cudaDeviceSynchronize(),
                    "cudaDeviceSynchronize after fill");
}

absl::StatusOr<std::vector<uint32_t>> ReadWords(const void* at,
                                                uint64_t words) {
  std::vector<uint32_t> host(words);
  MUONPS_RETURN_IF_ERROR(
      CudaStatus(cudaMemcpy(host.data(), at, words * 4, cudaMemcpyDeviceToHost),
                 "cudaMemcpy to host"));
  return host;
}

absl::Status CheckWords(const std::vector<uint32_t>& at, uint64_t first,
                        uint32_t (*pattern)(uint64_t), absl::string_view what) {
  for (uint64_t i = 0; i < at.size(); ++i) {
    if (at[i] != pattern(first + i)) {
      return absl::DataLossError(absl::StrCat(
          what, ": word ", first + i, " of the allocation is 0x",
          absl::Hex(at[i]), ", expected 0x", absl::Hex(pattern(first + i))));
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> RefArgs(const IpcMemoryRef& ref) {
  return {absl::BytesToHexString(ref.handle), absl::StrCat(ref.offset),
          absl::StrCat(ref.bytes), absl::StrCat(ref.device)};
}

namespace {

absl::Status Expect(bool holds, absl::string_view what) {
  return holds ? absl::OkStatus() : absl::InternalError(what);
}

struct OwnedStream {
  cudaStream_t stream = nullptr;
  ~OwnedStream() {
    if (stream != nullptr) (void)cudaStreamDestroy(stream);
  }
};

absl::StatusOr<IpcMemoryRef> ParseRef(const std::vector<std::string>& args,
                                      size_t start) {
  IpcMemoryRef ref;
  if (args.size() < start + 4 ||
      !absl::SimpleAtoi(args[start + 1], &ref.offset) ||
      !absl::SimpleAtoi(args[start + 2], &ref.bytes) ||
      !absl::SimpleAtoi(args[start + 3], &ref.device)) {
    return absl::InvalidArgumentError("want HANDLE_HEX OFFSET BYTES DEVICE");
  }
  ref.handle = absl::HexStringToBytes(args[start]);
  return ref;
}

// Whether CUDA still knows `ptr` as device memory (false once unmapped).
bool IsMappedDeviceMemory(const void* ptr) {
  cudaPointerAttributes attributes;
  std::memset(&attributes, 0, sizeof(attributes));
  if (cudaPointerGetAttributes(&attributes, ptr) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice;
}

// The child modes (see RunIpcChild). Each returns OK or why it failed.

// Opens REF, checks the parent's pattern in it and writes its own.
absl::Status ChildReadWrite(const std::vector<std::string>& args) {
  MUONPS_ASSIGN_OR_RETURN(const IpcMemoryRef ref, ParseRef(args, 0));
  IpcMemoryMap map;
  MUONPS_ASSIGN_OR_RETURN(void* lent, map.Open(ref));
  MUONPS_RETURN_IF_ERROR(Expect(map.open_mappings() == 1, "open_mappings"));
  MUONPS_ASSIGN_OR_RETURN(std::vector<uint32_t> seen,
                          ReadWords(lent, ref.bytes / 4));
  MUONPS_RETURN_IF_ERROR(
      CheckWords(seen, ref.offset / 4, Pattern, "lent range as opened"));
  return Fill(lent, ref.offset / 4, ref.bytes / 4, ChildPattern);
}

// EVENT_HEX REF: the copy out of REF waits on the parent's event, which the
// parent records behind a memset that a gate holds back until we say
// "enqueued" and it answers "go".
absl::Status ChildEventWait(const std::vector<std::string>& args) {
  MUONPS_ASSIGN_OR_RETURN(const IpcMemoryRef ref, ParseRef(args, 1));
  MUONPS_ASSIGN_OR_RETURN(
      IpcEvent ready,
      IpcEvent::Open(absl::HexStringToBytes(args[0]), ref.device));
  IpcMemoryMap map;
  MUONPS_ASSIGN_OR_RETURN(void* lent, map.Open(ref));
  OwnedStream own;
  MUONPS_RETURN_IF_ERROR(
      CudaStatus(cudaStreamCreateWithFlags(&own.stream, cudaStreamNonBlocking),
                 "cudaStreamCreateWithFlags"));
  DeviceBuffer copy;
  MUONPS_RETURN_IF_ERROR(
      CudaStatus(cudaMalloc(&copy.ptr, ref.bytes), "cudaMalloc"));
  MUONPS_RETURN_IF_ERROR(ready.MakeStreamWait(own.stream));
  MUONPS_RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(copy.ptr, lent, ref.bytes,
                                 cudaMemcpyDeviceToDevice, own.stream),
                 "cudaMemcpyAsync out of the lent range"));
  // From here the stream holds work behind the parent's gate: answer the
  // parent before judging anything, or the gate never opens and returning
  // (cudaFree syncs the device) hangs.
  const absl::StatusOr<bool> done_early = ready.Done();
  const cudaError_t query = cudaStreamQuery(own.stream);
  std::cout << "enqueued" << std::endl;
  std::string line;
  const bool go = std::getline(std::cin, line) && line == "go";
  MUONPS_RETURN_IF_ERROR(Expect(
      go,
      absl::StrCat("expected \"go\", read \"", line, "\" (or end of input)")));
  MUONPS_RETURN_IF_ERROR(done_early.status());
  MUONPS_RETURN_IF_ERROR(Expect(
      !*done_early, "the parent's event was done before its gate opened"));
  MUONPS_RETURN_IF_ERROR(
      Expect(query == cudaErrorNotReady,
             absl::StrCat("the waiting copy's stream answered ",
                          cudaGetErrorName(query), " before the gate opened")));
  MUONPS_RETURN_IF_ERROR(
      CudaStatus(cudaStreamSynchronize(own.stream), "cudaStreamSynchronize"));
  MUONPS_ASSIGN_OR_RETURN(const bool done, ready.Done());
  MUONPS_RETURN_IF_ERROR(Expect(done, "event not done after the wait"));
  MUONPS_ASSIGN_OR_RETURN(std::vector<uint32_t> seen,
                          ReadWords(copy.ptr, ref.bytes / 4));
  const uint32_t memset_word = 0x01010101u * kMemsetByte;
  for (uint64_t i = 0; i < seen.size(); ++i) {
    if (seen[i] != memset_word) {
      return absl::DataLossError(absl::StrCat(
          "copied word ", i, " is 0x", absl::Hex(seen[i]),
          ": the copy ran before the parent's memset (the wait did not hold)"));
    }
  }
  return absl::OkStatus();
}

// REF_A REF_B: two refs into one 1 MiB allocation, A at offset 0 and B at
// 512 KiB, each 4096 bytes.
absl::Status ChildDedupe(const std::vector<std::string>& args) {
  MUONPS_ASSIGN_OR_RETURN(const IpcMemoryRef a, ParseRef(args, 0));
  MUONPS_ASSIGN_OR_RETURN(const IpcMemoryRef b, ParseRef(args, 4));
  IpcMemoryMap map;
  MUONPS_ASSIGN_OR_RETURN(void* pa, map.Open(a));
  MUONPS_ASSIGN_OR_RETURN(void* pb, map.Open(b));
  MUONPS_RETURN_IF_ERROR(Expect(
      map.open_mappings() == 1,
      absl::StrCat("two refs into one allocation made ", map.open_mappings(),
                   " mappings (did the two exports give different handles?)")));
  MUONPS_RETURN_IF_ERROR(
      Expect(static_cast<char*>(pb) - static_cast<char*>(pa) ==
                 static_cast<ptrdiff_t>(b.offset - a.offset),
             "B's pointer is not A's plus the offsets' difference"));
  for (const auto& [ptr, ref] :
       {std::make_pair(pa, a), std::make_pair(pb, b)}) {
    MUONPS_ASSIGN_OR_RETURN(std::vector<uint32_t> seen,
                            ReadWords(ptr, ref.bytes / 4));
    MUONPS_RETURN_IF_ERROR(CheckWords(seen, ref.offset / 4, Pattern, "ref"));
  }
  MUONPS_ASSIGN_OR_RETURN(void* pa_again, map.Open(a));
  MUONPS_RETURN_IF_ERROR(Expect(pa_again == pa && map.open_mappings() == 1,
                                "reopening A gave another pointer or mapping"));

  IpcMemoryRef past_end = a;
  past_end.offset = uint64_t{768} << 10;
  past_end.bytes = uint64_t{2} << 20;
  absl::StatusOr<void*> refused = map.Open(past_end);
  MUONPS_RETURN_IF_ERROR(Expect(
      refused.status().code() == absl::StatusCode::kInvalidArgument,
      absl::StrCat("a range past the allocation's end opened as: ",
                   refused.status().ToString(),
                   " (does cuMemGetAddressRange work on IPC mappings?)")));
  IpcMemoryRef short_handle = a;
  short_handle.handle.resize(10);
  MUONPS_RETURN_IF_ERROR(
      Expect(map.Open(short_handle).status().code() ==
                     absl::StatusCode::kInvalidArgument &&
                 map.open_mappings() == 1,
             "a 10-byte handle was not INVALID_ARGUMENT, or changed the map"));

  // Three Opens of the handle succeeded: the third Close unmaps it.
  MUONPS_RETURN_IF_ERROR(map.Close(a));
  MUONPS_RETURN_IF_ERROR(map.Close(b));
  MUONPS_RETURN_IF_ERROR(
      Expect(map.open_mappings() == 1 && IsMappedDeviceMemory(pa),
             "closed before its last use was undone"));
  MUONPS_RETURN_IF_ERROR(map.Close(a));
  MUONPS_RETURN_IF_ERROR(Expect(map.open_mappings() == 0, "still listed"));
  MUONPS_RETURN_IF_ERROR(
      Expect(!IsMappedDeviceMemory(pa), "still mapped after the last Close"));
  MUONPS_RETURN_IF_ERROR(
      Expect(map.Close(a).code() == absl::StatusCode::kNotFound,
             "closing a closed handle was not NOT_FOUND"));

  // Moves hand the mapping on; destruction closes it.
  void* moved = nullptr;
  {
    IpcMemoryMap first;
    MUONPS_ASSIGN_OR_RETURN(moved, first.Open(b));
    IpcMemoryMap second(std::move(first));
    IpcMemoryMap third;
    third = std::move(second);
    MUONPS_RETURN_IF_ERROR(Expect(first.open_mappings() == 0 &&
                                      second.open_mappings() == 0 &&
                                      third.open_mappings() == 1,
                                  "moves did not hand the mapping on"));
    MUONPS_ASSIGN_OR_RETURN(std::vector<uint32_t> seen, ReadWords(moved, 1));
    MUONPS_RETURN_IF_ERROR(CheckWords(seen, b.offset / 4, Pattern, "moved"));
  }
  MUONPS_RETURN_IF_ERROR(Expect(!IsMappedDeviceMemory(moved),
                                "still mapped after the map's destruction"));
  void* last = nullptr;
  for (int round = 0; round < 20; ++round) {
    IpcMemoryMap scoped;
    MUONPS_ASSIGN_OR_RETURN(last, scoped.Open(a));
  }
  return Expect(!IsMappedDeviceMemory(last),
                "still mapped after 20 scoped maps were destroyed");
}

}  // namespace

int RunIpcChild(const std::string& mode, const std::vector<std::string>& args) {
  absl::Status status;
  if (mode == "read_write") {
    status = ChildReadWrite(args);
  } else if (mode == "event_wait") {
    status = ChildEventWait(args);
  } else if (mode == "dedupe") {
    status = ChildDedupe(args);
  } else {
    status = absl::InvalidArgumentError("unknown mode");
  }
  if (!status.ok()) {
    std::cerr << "ipc child (" << mode << "): " << status << std::endl;
    return 1;
  }
  std::cout << "done" << std::endl;
  return 0;
}

}  // namespace ipc_test
}  // namespace muonps
