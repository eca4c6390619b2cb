// ceil_log2: the rounds of a tree or of a doubling over n ranks, written once for loom's
// algorithms and the simulator that replays them.
#pragma once

#include <bit>

namespace loom {

/// @brief The smallest k with 2^k >= n (0 for n <= 1): how many rounds a binomial tree over n
/// ranks takes.
constexpr int ceil_log2(int n) noexcept {
  return n <= 1 ? 0 : std::bit_width(static_cast<unsigned>(n - 1));
}

}  // namespace loom
