#ifndef MUONPS_COMMON_PLANNER_MALLOC_H_
#define MUONPS_COMMON_PLANNER_MALLOC_H_

namespace muonps {

// A plan of 10^5 matrices allocates and first touches tens of megabytes.
// On a virtual machine each 4 KiB page's first touch is a costly fault,
// and a thread's first allocations open a malloc arena of its own whose
// pages are all new: on a 2-core VM the faults were about half of what the
// coordinator spent planning on its two threads. glibc's malloc reads two
// tunables from the environment at the program's start that remove most
// of them:
//   glibc.malloc.hugetlb=1           its heap on transparent huge pages
//                                    (2 MiB; it madvises them; glibc 2.35
//                                    and later),
//   glibc.malloc.arena_max=1         every thread allocates from that heap,
//   glibc.malloc.mmap_max=0          every block comes from the heap, not
//                                    from a mapping of its own that its
//                                    free unmaps (mmap_threshold stops at
//                                    32 MiB: a grouped plan's batches, 41
//                                    MiB at 10^5 matrices in five groups,
//                                    were mapped afresh, page by page, at
//                                    each plan made while one was held),
//   glibc.malloc.trim_threshold=1G   the heap keeps up to 1 GiB freed for
//                                    the next plan rather than handing it
//                                    back at each free (the coordinator's
//                                    memory stays at its largest plan's).
// Older glibcs ignore what they do not know, and kernels with transparent
// huge pages off ignore the advice.
//
// Call first thing in main: where the environment's GLIBC_TUNABLES tunes
// no glibc.malloc setting, this adds the four and executes the program
// again (/proc/self/exe: same process id, arguments and descriptors). It
// returns where the environment tunes glibc's malloc itself (left as it is:
// GLIBC_TUNABLES=glibc.malloc.hugetlb=0 runs with glibc's defaults) or
// where the exec failed; the program then runs on with its malloc as it is.
void RestartWithPlannerMalloc(char** argv);

}  // namespace muonps

#endif  // MUONPS_COMMON_PLANNER_MALLOC_H_
