// CommunicationProfiler: per-operation records (bytes, duration, bandwidth, algorithm) and
// per-operation statistics with latency percentiles; one relaxed load when switched off.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

namespace loom {

/// @brief One completed communication operation.
struct OperationRecord {
  std::string name;       ///< the node's name, or the operation for direct calls
  std::string operation;  ///< "allreduce", "send", ...
  std::size_t bytes = 0;
  int ranks = 0;
  std::string algorithm;      ///< "ring", "native", ...
  std::int64_t start_ns = 0;  ///< CommunicationProfiler::now_ns() at issue
  std::int64_t end_ns = 0;    ///< ... at completion

  double seconds() const noexcept { return static_cast<double>(end_ns - start_ns) * 1e-9; }
  /// @brief bytes / duration in GB/s (1e9 B/s); 0 for an instantaneous operation.
  double bandwidth_gbps() const noexcept {
    return end_ns > start_ns ? static_cast<double>(bytes) / static_cast<double>(end_ns - start_ns)
                             : 0.0;
  }
};

/// @brief Statistics of every record of one operation (and algorithm).
struct OperationStats {
  std::string operation;
  std::string algorithm;
  std::size_t count = 0;
  std::size_t total_bytes = 0;
  double total_s = 0;
  double average_gbps = 0;  ///< total bytes / total time
  double min_gbps = 0;
  double max_gbps = 0;
  double p50_s = 0;  ///< latency percentiles (nearest rank)
  double p95_s = 0;
  double p99_s = 0;
};

/// @brief Collects OperationRecords; thread-safe. When disabled, record() returns after one
/// relaxed atomic load, and callers test enabled() before building a record at all.
///
/// Memory is bounded however long it runs: it keeps per (operation, algorithm) aggregates
/// (count, bytes, time, min/max bandwidth: over every record) plus the latencies of the last
/// `window` records of each for the percentiles, and the last `window` records themselves.
class CommunicationProfiler {
 public:
  /// @brief Records kept by records(), and latencies per operation for the percentiles.
  static constexpr std::size_t default_window = 4096;

  explicit CommunicationProfiler(bool enabled = false, std::size_t window = default_window);
  ~CommunicationProfiler();
  CommunicationProfiler(const CommunicationProfiler&) = delete;
  CommunicationProfiler& operator=(const CommunicationProfiler&) = delete;

  bool enabled() const noexcept { return _enabled.load(std::memory_order_relaxed); }
  void set_enabled(bool on) noexcept { _enabled.store(on, std::memory_order_relaxed); }

  /// @brief Steady-clock nanoseconds: the timestamps records carry.
  static std::int64_t now_ns() noexcept;

  /// @brief Adds `record` (dropped when disabled).
  void record(OperationRecord record) {
    if (!enabled()) return;
    append(std::move(record));
  }

  /// @brief The most recent records (at most the window), oldest first.
  std::vector<OperationRecord> records() const;
  /// @brief Every record since construction or clear(), including those out of the window.
  std::size_t total_recorded() const;
  /// @brief One entry per (operation, algorithm), in order of first appearance: count, bytes,
  /// time and bandwidth over every record; p50/p95/p99 over the window's latencies.
  std::vector<OperationStats> stats() const;
  void clear();
  /// @brief A table of stats() for people.
  void write_report(std::ostream& out) const;

 private:
  void append(OperationRecord record);
  std::atomic<bool> _enabled;
  struct State;
  std::unique_ptr<State> _state;
};

}  // namespace loom
