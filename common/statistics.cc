#include "common/statistics.h"

#include <algorithm>
#include <cmath>

namespace muonps {

double Median(std::vector<double> values) {
  if (values.empty()) return std::nan("");
  const size_t n = values.size();
  std::nth_element(values.begin(), values.begin() + n / 2, values.end());
  const double upper = values[n / 2];
  if (n % 2 == 1) return upper;
  const double lower =
      *std::max_element(values.begin(), values.begin() + n / 2);
  return 0.5 * (lower + upper);
}

}  // namespace muonps
