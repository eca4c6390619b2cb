// Pattern: the deterministic inputs each rank contributes, and the check of every result element.
#pragma once

#include <cstddef>
#include <cstdint>

#include "loom/backend.hpp"
#include "loom/buffer.hpp"

namespace loom::bench {

/// @brief The inputs of one (collective, dtype, operator, ranks) combination.
///
/// Every input is a small integer chosen so that the result is exact in every dtype, whatever
/// order the ranks are combined in: sums stay within the integers float16 (2048), bfloat16
/// (256), int8 (127) and uint8 (255) hold, products are 2 or 3, averages divide a multiple of
/// the rank count; bool inputs are 0 or 1 (sum and max: or; prod and min: and); both halves of
/// a complex number hold the same integer. The expected result is computed here from the inputs,
/// never by a collective.
class Pattern {
 public:
  Pattern(Collective collective, DType dtype, ReduceOp op, int ranks, int root = 0);

  /// @brief What `rank` contributes at element `index` of its send buffer.
  std::int64_t input(int rank, std::size_t index) const;
  /// @brief The operator applied over every rank's input at `index`.
  std::int64_t reduced(std::size_t index) const;

  /// @brief Fills this rank's send buffer with its inputs (for broadcast, the one buffer) and
  /// the receive buffer with a filler that is not a plausible result.
  void fill(int rank, Buffer send, Buffer recv) const;
  /// @brief How many elements of this rank's result differ from the expectation.
  std::uint64_t count_wrong(int rank, Buffer recv) const;

 private:
  Collective _collective;
  DType _dtype;
  ReduceOp _op;
  int _ranks;
  int _root;
  std::int64_t _modulus = 1;  ///< inputs (or their varying part) are below this
};

}  // namespace loom::bench
