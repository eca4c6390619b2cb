// throw_invalid_argument: the throw that the library's argument checks share (private to the
// library, not part of the public API).
#pragma once

#include <string>

#include "loom/error.hpp"

namespace loom {

/// @brief Throws Error(ErrorCode::invalid_argument, message).
[[noreturn]] inline void throw_invalid_argument(const std::string& message) {
  throw Error(ErrorCode::invalid_argument, message);
}

}  // namespace loom
