// POSIX shared memory segments: how a trainer lends its parameter and
// gradient buffers to the worker on the same host when there is no GPU (the
// CPU twin of CUDA IPC handles).
//
// A SharedMemorySegment is one mapping of a named segment ("/muonps-...",
// visible as /dev/shm/muonps-... on Linux). The process that Create()s a name
// owns it and removes the name when its object is destroyed; processes that
// Open() the name map the same pages and only unmap them. Writes through one
// mapping are visible through every other mapping of the segment, in this or
// another process, with no copy.
//
// Thread-safety: the const accessors may be called concurrently from any
// number of threads. Moving, assigning or destroying a segment needs external
// synchronization with every other use of that object. The class does not
// synchronize the *contents* of the memory: readers and writers in different
// processes agree on their own protocol (events, a step counter, a
// transport's message) for when a buffer may be read.
//
// Lifetime: removing the name (the owner's destruction) does not invalidate
// mappings other processes already hold; the pages are freed when the last
// mapping is gone. A process that dies without running destructors (kill -9)
// leaves the name behind; it stays until someone calls shm_unlink() on it (or
// removes /dev/shm/<name>), and Create() with that name fails until then.
//
// Naming: /dev/shm is shared by every process on the host, including those
// in other PID namespaces (containers, Bazel's sandbox) where pids repeat, so
// a name needs more than a pid to be unique: a job id and rank, or a random
// token.
#ifndef MUONPS_LENDING_SHARED_MEMORY_H_
#define MUONPS_LENDING_SHARED_MEMORY_H_

#include <cstddef>
#include <string>
#include <utility>

#include "absl/status/statusor.h"

namespace muonps {

class SharedMemorySegment {
 public:
  // Names are "/" followed by 1 to 200 bytes with no "/" and no NUL in them.
  static constexpr size_t kMaxNameBytes = 200;

  // Creates the segment `name` of `bytes` bytes, zero-filled, readable and
  // writable by this user only (mode 0600), and maps it read-write. The
  // returned object owns the name: its destruction removes it.
  //
  // The pages are reserved up front (posix_fallocate), so a /dev/shm too
  // small for `bytes` fails here instead of killing the process with SIGBUS
  // on first touch (containers often mount a 64 MiB /dev/shm).
  //
  // Fails, leaving no name behind, with:
  //   INVALID_ARGUMENT naming "name" if `name` is not "/" + 1..200 bytes
  //     without "/" or NUL; naming "bytes" if `bytes` is 0 or exceeds what
  //     the file size (off_t) can hold;
  //   ALREADY_EXISTS if a segment with that name exists (from a live process
  //     or left behind by a dead one);
  //   RESOURCE_EXHAUSTED if /dev/shm, memory or file descriptors run out;
  //   PERMISSION_DENIED or INTERNAL for other system errors (the message
  //     names the call and errno text).
  static absl::StatusOr<SharedMemorySegment> Create(const std::string& name,
                                                    size_t bytes);

  // Maps the existing segment `name` read-write. The returned object does
  // not own the name: its destruction only unmaps this process's view.
  //
  // Fails with:
  //   INVALID_ARGUMENT naming "name" for a malformed name (same rules as
  //     Create), naming "expected_bytes" if it is 0;
  //   NOT_FOUND if no segment has that name;
  //   PERMISSION_DENIED naming the segment if another user owns it (a
  //     process may lend only its own user's memory; checked before
  //     mapping);
  //   FAILED_PRECONDITION if the segment's size is not `expected_bytes`
  //     (the message gives both), so a worker never maps a buffer laid out
  //     for another model;
  //   PERMISSION_DENIED, RESOURCE_EXHAUSTED or INTERNAL for system errors.
  static absl::StatusOr<SharedMemorySegment> Open(const std::string& name,
                                                  size_t expected_bytes);

  // Moves transfer the mapping and, for a creator, the duty to remove the
  // name. The moved-from object is empty: data() is null, size() is 0,
  // name() is "", and its destruction does nothing. Assigning over a segment
  // first releases the one it held.
  SharedMemorySegment(SharedMemorySegment&& other) noexcept;
  SharedMemorySegment& operator=(SharedMemorySegment&& other) noexcept;

  // A mapping has exactly one object that releases it.
  SharedMemorySegment(const SharedMemorySegment&) = delete;
  SharedMemorySegment& operator=(const SharedMemorySegment&) = delete;

  // Unmaps the segment; if this object created it, also removes the name.
  ~SharedMemorySegment();

  // Start of the mapping (page-aligned), valid until this object is
  // destroyed or moved from. Null for an empty (moved-from) object.
  void* data() const { return data_; }

  // Bytes mapped; the segment's exact size.
  size_t size() const { return size_; }

  // The name the segment was created or opened with.
  const std::string& name() const { return name_; }

  // True for the object returned by Create() (and whatever it moves to).
  bool is_owner() const { return owner_; }

  // OK while the memory object behind the mapping still holds size()
  // bytes; FAILED_PRECONDITION naming the segment once something truncated
  // it (touching the lost pages would raise SIGBUS). One fstat.
  absl::Status CheckSize() const;

 private:
  SharedMemorySegment(std::string name, void* data, size_t size, bool owner,
                      int fd)
      : name_(std::move(name)),
        data_(data),
        size_(size),
        owner_(owner),
        fd_(fd) {}

  // Unmaps, removes the name if owned, and leaves the object empty.
  void Release();

  std::string name_;
  void* data_ = nullptr;
  size_t size_ = 0;
  bool owner_ = false;
  int fd_ = -1;  // the memory object, kept for CheckSize
};

}  // namespace muonps

#endif  // MUONPS_LENDING_SHARED_MEMORY_H_
