// Order statistics of measured times: one definition for every place that
// reports or decides by a median (benchmarks, the autotuner, the
// coordinator's measured speeds). Pure functions.
#ifndef MUONPS_COMMON_STATISTICS_H_
#define MUONPS_COMMON_STATISTICS_H_

#include <vector>

namespace muonps {

// The median of `values`: the middle one of an odd count, the mean of the
// two middle ones of an even count; NaN for none.
double Median(std::vector<double> values);

}  // namespace muonps

#endif  // MUONPS_COMMON_STATISTICS_H_
