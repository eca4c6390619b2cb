// run_benchmark: the sweep over collectives, dtypes, operators, sizes and algorithms.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "harness.hpp"
#include "implementation.hpp"
#include "options.hpp"
#include "report.hpp"

namespace loom::bench {

/// @brief Runs the sweep `options` asks for on this rank. For every step and algorithm:
/// fill the inputs, run once and check every element (-c 1), run the warm-ups, barrier, time
/// the iterations; the row gets the slowest rank's average time. Algorithms take turns at
/// each size and share the same buffers. Rank 0 passes its report; other ranks pass nullptr.
/// Returns the number of wrong values over every rank and step (the same on every rank).
std::int64_t run_benchmark(const Options& options, Backend& backend, Harness& harness,
                           const std::vector<std::unique_ptr<Implementation>>& algorithms,
                           Report* report);

}  // namespace loom::bench
