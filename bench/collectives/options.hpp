// Options: loom-collectives' command line, parsed and validated (nccl-tests' flags where they
// exist).
#pragma once

#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "loom/backend.hpp"
#include "loom/dtype.hpp"

namespace loom::bench {

/// @brief A bad command line; main() prints it and exits with status 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// @brief Everything the command line chooses.
struct Options {
  std::size_t min_bytes = 8;
  std::size_t max_bytes = 32 * 1024 * 1024;
  std::size_t step_factor = 2;
  std::vector<Collective> collectives{Collective::allreduce};
  std::vector<DType> dtypes{DType::float32};
  std::vector<ReduceOp> reduce_ops{ReduceOp::sum};
  int iterations = 20;
  int warmups = 5;
  /// @brief --min_time: each round of a size lasts at least this long (0: -n as given); the
  /// iterations are raised from the fastest warm-up call, the same on every rank.
  int min_time_ms = 0;
  /// @brief Timing rounds per size: the algorithms take turns round by round and each row
  /// reports its median round, so all algorithms see the same background load.
  int repeats = 1;
  bool check = true;
  std::vector<std::string> algorithms{"native"};
  bool all_algorithms = false;  ///< -a all: mpi-raw is dropped where it cannot run
  std::string json_path;        ///< empty: no JSON file
  std::string backend;          ///< empty: create_backend()'s choice (mpi under mpirun, else local)
  std::optional<int> ranks;
  bool info = false;
  bool help = false;
};

/// @brief The most timed iterations per round (-n, or what --min_time asks for).
inline constexpr int max_iterations = 1 << 30;

/// @brief Parses argv; throws UsageError naming the flag and the value it could not use.
Options parse_options(int argc, const char* const* argv);

/// @brief The --help text.
std::string usage();

/// @brief "8", "64K", "16M", "1G" (powers of 1024, as nccl-tests) to bytes; throws UsageError.
std::size_t parse_size(const std::string& text, const std::string& flag);

/// @brief The algorithms -a accepts ("all" stands for every one of them): every row of the
/// algorithm table, "auto" and "mpi-raw".
std::vector<std::string> known_algorithms();

}  // namespace loom::bench
