// StreamingQuantile: exact values first, then a fixed logarithmic histogram.
#include "loom/streaming_quantile.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "loom/error.hpp"

namespace loom {
namespace {

constexpr double lowest = 1e-6;  // the histogram's span: [lowest, highest)
constexpr double highest = 1e6;

}  // namespace

StreamingQuantile::StreamingQuantile(std::size_t exact_values, double relative_resolution) {
  if (!(relative_resolution > 0 && relative_resolution < 1))
    throw Error(ErrorCode::invalid_argument, "StreamingQuantile: relative_resolution " +
                                                 std::to_string(relative_resolution) +
                                                 " is outside (0, 1)");
  _exact.reserve(exact_values);
  _log_base = std::log1p(relative_resolution);
  const auto bins = static_cast<std::size_t>(std::ceil(std::log(highest / lowest) / _log_base));
  _bins.assign(bins + 1, 0);
}

std::size_t StreamingQuantile::heap_bytes() const noexcept {
  return _exact.capacity() * sizeof(double) + _bins.capacity() * sizeof(std::uint64_t);
}

std::size_t StreamingQuantile::bin_of(double value) const noexcept {
  if (value == 0) return 0;
  const double position = std::log(std::max(value, lowest) / lowest) / _log_base;
  return 1 + std::min(static_cast<std::size_t>(position), _bins.size() - 2);
}

double StreamingQuantile::centre_of(std::size_t bin) const noexcept {
  if (bin == 0) return 0;
  return lowest * std::exp((static_cast<double>(bin - 1) + 0.5) * _log_base);
}

void StreamingQuantile::add_to_histogram(double value) {
  ++_bins[bin_of(value)];
}

void StreamingQuantile::add(double value) {
  if (!(value >= 0))
    throw Error(ErrorCode::invalid_argument,
                "StreamingQuantile::add: " + std::to_string(value) +
                    " is not a non-negative number (durations and ratios only)");
  _min = _count ? std::min(_min, value) : value;
  _max = _count ? std::max(_max, value) : value;
  _sum += value;
  ++_count;
  if (_count <= _exact.capacity()) {
    _exact.push_back(value);
    return;
  }
  if (!_exact.empty()) {  // the first value past the exact ones: they move into the bins
    for (double v : _exact) add_to_histogram(v);
    _exact.clear();
  }
  add_to_histogram(value);
}

double StreamingQuantile::quantile(double q) const {
  if (!(q >= 0 && q <= 1))
    throw Error(ErrorCode::invalid_argument,
                "StreamingQuantile::quantile: q " + std::to_string(q) + " is outside [0, 1]");
  if (_count == 0) return 0;
  if (exact()) {
    std::vector<double> sorted(_exact);
    std::sort(sorted.begin(), sorted.end());
    const double position = q * static_cast<double>(sorted.size() - 1);
    const auto below = static_cast<std::size_t>(std::floor(position));
    const std::size_t above = std::min(below + 1, sorted.size() - 1);
    // Linear between the two neighbours: the median of an even count is their mean.
    return sorted[below] +
           (position - static_cast<double>(below)) * (sorted[above] - sorted[below]);
  }
  // The value of rank ceil(q * count) (1-based), as the exact form's for odd counts.
  const auto rank = std::max<std::uint64_t>(
      1, static_cast<std::uint64_t>(std::ceil(q * static_cast<double>(_count))));
  std::uint64_t seen = 0;
  for (std::size_t bin = 0; bin < _bins.size(); ++bin) {
    seen += _bins[bin];
    if (seen >= rank) return std::clamp(centre_of(bin), _min, _max);
  }
  return _max;
}

}  // namespace loom
