// A byte count as plans and reports print it ("25 MiB", "256 KiB", "12 B"): parallel's own
// internal helper, shared by describe() (plan.cpp) and GradientReducer::explain().
#pragma once

#include <cstddef>
#include <sstream>
#include <string>

namespace loom::detail {

inline std::string bytes_text(std::size_t bytes) {
  std::ostringstream out;
  if (bytes >= (std::size_t{1} << 20) && bytes % (std::size_t{1} << 20) == 0)
    out << (bytes >> 20) << " MiB";
  else if (bytes >= (std::size_t{1} << 10))
    out << (bytes + 512) / 1024 << " KiB";
  else
    out << bytes << " B";
  return out.str();
}

}  // namespace loom::detail
