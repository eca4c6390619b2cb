// Report: the rows of a run, printed as nccl-tests prints them, and their JSON form.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "loom/backend.hpp"

namespace loom::bench {

/// @brief One measured (collective, dtype, operator, size, algorithm).
struct Row {
  Collective collective = Collective::allreduce;
  DType dtype = DType::float32;
  std::optional<ReduceOp> op;  ///< none for collectives that do not reduce
  std::size_t bytes = 0;
  std::size_t count = 0;
  std::string algorithm;
  int ranks = 1;
  double time_us = 0;  ///< average per iteration, the slowest rank's
  double algbw_gbps = 0;
  double busbw_gbps = 0;
  std::optional<std::int64_t> wrong;  ///< wrong elements over all ranks; none without -c 1
  int iterations = 0;                 ///< timed calls per round (-n, or raised by --min_time)
};

/// @brief Prints to `out` (rank 0's stdout) as rows arrive, and keeps them for the footer
/// and the JSON file.
class Report {
 public:
  explicit Report(std::FILE* out) : _out(out) {}

  /// @brief A "# ..." line.
  void comment(const std::string& text);
  /// @brief The title and column header of one collective's table.
  void begin_table(Collective collective, int root);
  void add(const Row& row);
  /// @brief "# Out of bounds values : N OK|FAILED", "# Avg bus bandwidth : X" and, when
  /// native and mpi-raw both ran, their median time ratio.
  void footer(bool checked);

  const std::vector<Row>& rows() const noexcept { return _rows; }

 private:
  /// @brief When auto ran: per size, the best candidate, auto's speed relative to it, and the
  /// geometric means (vs best, vs mpi-raw).
  void regret_table();
  std::FILE* _out;
  std::vector<Row> _rows;
};

/// @brief The rows as a JSON array of objects with keys op, dtype, redop, bytes, count, algo,
/// ranks, time_us, algbw_gbps, busbw_gbps, wrong.
std::string to_json(const std::vector<Row>& rows);

/// @brief The median over sizes of time(numerator) / time(denominator), pairing rows of the
/// same collective, dtype, operator and size; none when no pair exists.
std::optional<double> median_time_ratio(const std::vector<Row>& rows, const std::string& numerator,
                                        const std::string& denominator, std::size_t* pairs);

}  // namespace loom::bench
