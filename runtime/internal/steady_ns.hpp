// steady_ns: the steady clock in nanoseconds, the time base of the progress board, the flight
// recorder, the communication profiler and the trace clock alignment (private to the library,
// not part of the public API).
#pragma once

#include <chrono>
#include <cstdint>

namespace loom {

/// @brief std::chrono::steady_clock::now() as nanoseconds since the clock's epoch.
inline std::int64_t steady_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace loom
