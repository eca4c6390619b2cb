// Checks every collective and point-to-point operation of a Backend against values computed
// here, independently of loom's kernels; shared by the local and the MPI test binaries.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "loom/backend.hpp"

namespace loom::testing {

/// @brief One collective call to verify.
struct Case {
  Collective op;
  DType dtype;
  ReduceOp redop;
  std::size_t count;  ///< per-rank element count (the block size for scatter/gather-like ops)
  bool in_place = false;
};

std::string describe(const Case& c);

/// @brief Every reduce op the dtype supports (or sum only when `op` does not reduce),
/// every count, and the in-place form where the op has one. For int8, int16, bool and
/// complex64, counts above `element_size_covered_count` become that count (4099, odd and prime):
/// the long counts test how algorithms chunk and pipeline buffers, which depends only on the
/// element size, and uint8, float16 and float64 (1, 2 and 8 bytes) run them at full length,
/// complex128 (16 bytes) too; those types' arithmetic at long lengths is reduce_test's and the
/// dtype fuzzer's. This keeps the matrices' time (under the sanitizers most) near what seven
/// dtypes took. In the sanitizer builds bfloat16, int32 and int64 are capped too, leaving one
/// type of each width at full length (uint8, float16, float32, float64, complex128): a memory or
/// threading error in a chunked path depends on the element size, and those builds spent most of
/// the test command's ASan part in the matrices' long counts; the Release suite runs all eight.
std::vector<Case> cases_for(Collective op, DType dtype, const std::vector<std::size_t>& counts);
inline constexpr std::size_t element_size_covered_count = 4099;

/// @brief Runs `c` on `backend` and compares every element with the expected value.
/// Returns an empty string when all match, else the first wrong element and the number wrong.
std::string check(Backend& backend, const Case& c);

/// @brief Ring exchange with send/recv (known size) and recv_message/probe (unknown size).
std::string check_point_to_point(Backend& backend, DType dtype, std::size_t count);

/// @brief The large count: 1M + 3 in the Release suite. The sanitizer builds
/// (scripts/run-sanitizers.sh) instrument every load and store, which makes the 1M cases 10-30x
/// slower on a 2-core CI machine; there 64K + 3 runs the same code paths (odd, not a multiple of
/// any chunk or rank count) for what those builds check, memory and thread safety.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr std::size_t large_count = (1u << 16) + 3;
#else
inline constexpr std::size_t large_count = (1u << 20) + 3;
#endif

inline const std::vector<std::size_t> standard_counts{0, 1, 7, large_count};

inline constexpr Collective all_collectives[] = {
    Collective::broadcast,      Collective::reduce,   Collective::allreduce, Collective::allgather,
    Collective::reduce_scatter, Collective::alltoall, Collective::barrier};

}  // namespace loom::testing
