// The Newton-Schulz vocabulary every layer shares: the algorithm names
// (NsAlgorithm: dense NS5 or Gram NS), the options of the orthogonalization
// and the per-iteration coefficients it uses (the fixed quintic or Polar
// Express). The kernels run these; the scheduler plans with them; proto/
// translates them. Depends on common/ only.
//
// NS normalizes X by max(margin * ||X||_F, eps), works on the wide
// orientation (rows <= cols), and iterates X <- a X + (b A + c A^2) X with
// A = X X^T. Gram NS computes the same polynomial on the small side (see
// kernels/README.md). Plain values; thread-safe.
#ifndef MUONPS_NEWTON_SCHULZ_OPTIONS_H_
#define MUONPS_NEWTON_SCHULZ_OPTIONS_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muonps {

enum class NsAlgorithm {
  kNs5,   // dense iteration on the m x n matrix
  kGram,  // iteration on the m x m Gram matrix, Q X0 at the end
};

// Parses "ns5" or "gram"; INVALID_ARGUMENT naming `ns_algorithm` otherwise.
absl::StatusOr<NsAlgorithm> ParseNsAlgorithm(absl::string_view name);
absl::string_view NsAlgorithmName(NsAlgorithm algorithm);

struct NsCoefficients {
  double a;
  double b;
  double c;
};

// torch.optim.Muon's defaults.
inline constexpr NsCoefficients kQuinticCoefficients = {3.4445, -4.7750,
                                                        2.0315};

struct NewtonSchulzOptions {
  NsAlgorithm algorithm = NsAlgorithm::kNs5;
  int steps = 5;
  // Used for every step unless `polar_express` is set.
  NsCoefficients coefficients = kQuinticCoefficients;
  // Per-iteration Polar Express coefficients (safety factor applied) instead
  // of `coefficients`; normalization then divides by 1.02 ||X||_F, since
  // those polynomials diverge for singular values just above 1.
  bool polar_express = false;
  double eps = 1e-7;
  // Gram NS only: after these iterations (1-based; values >= steps have no
  // effect, so the default suits any step count) X is re-formed
  // (X <- Q X0, R <- X X^T, Q <- I) to stop rounding drift in R. A restart
  // also happens whenever R loses positive semi-definiteness visibly (a
  // negative or non-finite diagonal entry).
  std::vector<int> gram_restarts = {2};
  // Opt-in AOL preconditioning (Turbo-Muon: Boissin et al. 2025,
  // arXiv:2512.04632): after the Frobenius normalization, X <- S X with
  // S = diag(1 / (margin * sqrt(sum_j |(X X^T)_ij|))), which bounds
  // ||S X||_2 by 1 (the row sums of |S X X^T S| are <= 1) and lifts the
  // small singular values above where ||X||_F puts them, so one iteration
  // fewer reaches the same error on well-conditioned inputs (set `steps` to
  // 4). The first iteration reuses X X^T, so it costs one pass over an m x m
  // matrix. With Polar Express the table's first polynomial is skipped
  // (iteration k uses the table's k + 1), as the Turbo-Muon record does.
  // Off by default: torch.optim.Muon has no preconditioning.
  bool aol = false;
};

// INVALID_ARGUMENT naming the field unless 1 <= steps <= 100, eps > 0 and
// finite, coefficients finite, gram_restarts each >= 1.
absl::Status ValidateNewtonSchulzOptions(const NewtonSchulzOptions& options);

// Coefficients of iteration `step` (0-based), after the skip that `aol`
// implies for Polar Express.
NsCoefficients CoefficientsForStep(const NewtonSchulzOptions& options,
                                   int step);

// Factor on ||X||_F in the normalization: 1.02 with Polar Express, else 1.
double NormalizationMargin(const NewtonSchulzOptions& options);

}  // namespace muonps

#endif  // MUONPS_NEWTON_SCHULZ_OPTIONS_H_
