// Fold: how recursive doubling and halving run on a rank count that is not a power of two.
#pragma once

namespace loom::algorithms {

/// @brief The standard fold (Thakur, Rabenseifner & Gropp 2005): with p2 the largest power of
/// two <= p and rem = p - p2, each even rank r < 2 rem hands its data to r + 1 and sits out;
/// the p2 ranks left are renumbered 0..p2-1 and run the power-of-two algorithm.
struct Fold {
  Fold(int rank, int world);
  int p2;       ///< ranks taking part after the fold (a power of two)
  int rem;      ///< world - p2
  int newrank;  ///< this rank's number among the p2, or -1 if it sits out
  int steps;    ///< log2(p2)
  /// @brief The real rank of participant `v`.
  int real(int v) const noexcept { return v < rem ? 2 * v + 1 : v + rem; }
  /// @brief Whether this rank sends its data away in the fold (an even rank < 2 rem).
  bool sits_out() const noexcept { return newrank < 0; }
  /// @brief Whether this rank receives a neighbour's data in the fold (an odd rank < 2 rem).
  bool absorbs() const noexcept { return newrank >= 0 && newrank < rem; }
};

}  // namespace loom::algorithms
