// bytes_text: a byte count as loom's reports and drawings print it (private to the library, not
// part of the public API).
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>

namespace loom {

/// @brief How bytes_text writes a count of 1 KiB or more.
enum class BytesPrecision {
  whole,        ///< "25 MiB" for whole MiB, else "1537 KiB" (to the nearest KiB): plans, reports
  one_decimal,  ///< "1.5 MiB", "1.0 KiB": the labels of graph drawings
};

/// @brief "12 B" below 1 KiB; KiB or MiB from there, as `precision` says.
inline std::string bytes_text(std::size_t bytes, BytesPrecision precision = BytesPrecision::whole) {
  constexpr std::size_t kib = std::size_t{1} << 10, mib = std::size_t{1} << 20;
  char text[32];
  if (bytes < kib)
    std::snprintf(text, sizeof text, "%zu B", bytes);
  else if (precision == BytesPrecision::one_decimal && bytes >= mib)
    std::snprintf(text, sizeof text, "%.1f MiB", bytes / 1048576.0);
  else if (precision == BytesPrecision::one_decimal)
    std::snprintf(text, sizeof text, "%.1f KiB", bytes / 1024.0);
  else if (bytes >= mib && bytes % mib == 0)
    std::snprintf(text, sizeof text, "%zu MiB", bytes >> 20);
  else
    std::snprintf(text, sizeof text, "%zu KiB", (bytes + 512) / 1024);
  return text;
}

}  // namespace loom
