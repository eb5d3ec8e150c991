#ifndef MUONPS_COMMON_HUGE_PAGE_MALLOC_H_
#define MUONPS_COMMON_HUGE_PAGE_MALLOC_H_

namespace muonps {

// The coordinator's plans allocate and first touch tens of megabytes per
// plan for 10^5 matrices. On a virtual machine each 4 KiB page's first touch
// is a costly fault: on a 2-core VM the faults were about half of a plan's
// time. glibc's malloc puts its heaps on transparent huge pages (2 MiB, it
// madvises them) when the tunable glibc.malloc.hugetlb=1 is in the
// environment at the program's start (glibc 2.35 and later; older ones, and
// kernels with transparent huge pages off, ignore it).
//
// Call first thing in main: where the environment's GLIBC_TUNABLES lacks
// glibc.malloc.hugetlb, this adds glibc.malloc.hugetlb=1 to it and executes
// the program again (/proc/self/exe: same process id, arguments and
// descriptors). It returns where the tunable was already there (a setting
// of its own, 0 included, is kept) or where the exec failed; the program
// then runs on with its malloc as it is.
void RestartWithHugePageMalloc(char** argv);

}  // namespace muonps

#endif  // MUONPS_COMMON_HUGE_PAGE_MALLOC_H_
