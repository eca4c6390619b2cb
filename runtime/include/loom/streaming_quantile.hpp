// StreamingQuantile: the median (or any quantile) of an unbounded series in fixed memory.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace loom {

/// @brief Quantiles of a series of non-negative values (step times, overlap efficiencies) in
/// a fixed amount of memory, however long the series: what a training loop of millions of
/// steps may keep per step.
///
/// The first `exact_values` values are kept as they are and quantiles of them are exact (the
/// median of an even count is the mean of the two middle values, as usual). From the next value
/// on, every value goes into a histogram of logarithmic bins spanning [1e-6, 1e6), each
/// `relative_resolution` wide; a quantile is then the geometric centre of its bin, within
/// half a bin (0.25% by default) of an exact quantile. Zero has its own bin; values outside the
/// span are clamped into its first or last bin (min() and max() stay exact). Memory: about
/// 8 bytes x (exact_values + bins), 52 KiB by default, fixed at construction.
class StreamingQuantile {
 public:
  static constexpr std::size_t default_exact_values = 1024;
  static constexpr double default_relative_resolution = 0.005;

  explicit StreamingQuantile(std::size_t exact_values = default_exact_values,
                             double relative_resolution = default_relative_resolution);

  /// @brief Adds `value`; a negative or NaN value is ErrorCode::invalid_argument naming it.
  void add(double value);
  /// @brief The q-quantile (0 <= q <= 1; 0.5 the median); 0 when nothing was added.
  double quantile(double q) const;
  double median() const { return quantile(0.5); }
  std::uint64_t count() const noexcept { return _count; }
  double min() const noexcept { return _count ? _min : 0; }
  double max() const noexcept { return _count ? _max : 0; }
  double mean() const noexcept { return _count ? _sum / static_cast<double>(_count) : 0; }
  /// @brief Whether quantile() is exact (at most exact_values values added so far).
  bool exact() const noexcept { return _count <= _exact.capacity(); }
  /// @brief Bytes this object holds on the heap (constant after construction).
  std::size_t heap_bytes() const noexcept;

 private:
  void add_to_histogram(double value);
  std::size_t bin_of(double value) const noexcept;
  double centre_of(std::size_t bin) const noexcept;

  std::vector<double> _exact;        // reserved once; never grows past its capacity
  std::vector<std::uint64_t> _bins;  // [0]: zero; [1..]: logarithmic bins
  double _log_base = 0;              // ln(1 + relative_resolution)
  std::uint64_t _count = 0;
  double _min = 0, _max = 0, _sum = 0;
};

}  // namespace loom
