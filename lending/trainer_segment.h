// The names of the shared-memory segments a trainer lends to its worker,
// and the worker's housekeeping of them. One format, used by the client
// that creates a segment and the worker that checks it:
//
//   /muonps-JOB-rRANK-PID-TOKEN
//
// JOB is the job's name, RANK the trainer's rank in it, PID the creating
// process's id (in its own PID namespace) and TOKEN a random decimal
// number, since pids repeat across the PID namespaces (containers,
// sandboxes) that share /dev/shm. A worker maps only segments named for its
// job and the attaching trainer, so a trainer cannot make it map another
// job's or another rank's buffers.
//
// Thread-safety: the functions keep no state; RemoveStaleTrainerSegments
// races benignly with processes creating or removing segments.
#ifndef MUONPS_LENDING_TRAINER_SEGMENT_H_
#define MUONPS_LENDING_TRAINER_SEGMENT_H_

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace muonps {

// How a worker says it holds no buffers of a trainer (FAILED_PRECONDITION
// of Step): it restarted, or released them. The client attaches again.
constexpr char kNoTrainerAttached[] = "no trainer buffers are attached";

// The segment name of trainer `rank` of `job`, created by process `pid`
// with random `token`.
std::string TrainerSegmentName(const std::string& job, int rank, int64_t pid,
                               uint32_t token);

// OK when `name` is TrainerSegmentName(job, rank, P, T) for some pid P
// (equal to `pid` unless `pid` is 0) and token T; INVALID_ARGUMENT naming
// the field `segment`, the name and the form expected otherwise.
absl::Status CheckTrainerSegmentName(const std::string& name,
                                     const std::string& job, int rank,
                                     int64_t pid);

// Removes from `shm_dir` (/dev/shm) the segments of job `job`'s trainers
// owned by user `uid` whose creating pid, read from the name, no longer runs
// in this PID namespace: the leftovers of killed trainers of this job
// (kill -9 runs no destructor). Only the worker's own job: a pid is judged
// in this process's PID namespace, and trainers of other jobs may live in
// other namespaces that share /dev/shm (containers, test sandboxes), where
// their live pids look dead from here. Leaves alone other jobs' and users'
// files, names not of the form above, and segments of live pids. Returns
// how many it removed; INTERNAL naming the directory if it cannot be read.
absl::StatusOr<int> RemoveStaleTrainerSegments(const std::string& shm_dir,
                                               const std::string& job,
                                               uid_t uid);

}  // namespace muonps

#endif  // MUONPS_LENDING_TRAINER_SEGMENT_H_
