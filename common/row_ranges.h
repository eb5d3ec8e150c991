// How row_sharded matrices split among trainer ranks: rank r of n holds
// rows [rows * r / n, rows * (r + 1) / n). The client library, the workers and
// any trainer agree on this one rule. Pure functions.
#ifndef MUONPS_COMMON_ROW_RANGES_H_
#define MUONPS_COMMON_ROW_RANGES_H_

#include <cstdint>
#include <utility>

namespace muonps {

inline std::pair<int64_t, int64_t> TrainerRowRange(int64_t rows, int rank,
                                                   int count) {
  return {rows * rank / count, rows * (rank + 1) / count};
}

}  // namespace muonps

#endif  // MUONPS_COMMON_ROW_RANGES_H_
