// Fuzzes parse_algorithm_ranges (LOOM_ALLREDUCE="rd:0-8K;ring:8K-max" and the other
// LOOM_<COLL> variables): any text either parses into non-empty, ordered, non-overlapping
// [lo, hi) ranges, or is refused with invalid_argument naming what it could not use.
#include <string>

#include "fuzz/fuzz_env.hpp"
#include "loom/error.hpp"
#include "loom/tuning.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace loom::fuzz;
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<loom::AlgorithmRange> ranges;
  try {
    ranges = loom::parse_algorithm_ranges(text);
  } catch (const loom::Error& e) {
    if (e.code() != loom::ErrorCode::invalid_argument)
      contract_broken("wrong code " + std::string(loom::to_string(e.code())), text);
    if (e.message().empty()) contract_broken("an empty message", text);
    return 0;
  }
  for (const auto& range : ranges)
    if (range.min_bytes >= range.max_bytes) contract_broken("an empty or inverted range", text);
  // Overlap in any order is refused, so accepted ranges are pairwise disjoint.
  for (std::size_t i = 0; i < ranges.size(); ++i)
    for (std::size_t j = i + 1; j < ranges.size(); ++j)
      if (ranges[i].min_bytes < ranges[j].max_bytes && ranges[j].min_bytes < ranges[i].max_bytes)
        contract_broken("overlapping ranges accepted", text);
  return 0;
}
