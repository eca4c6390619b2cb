// loom::Error and the names of its codes.
#include "loom/error.hpp"

namespace loom {

std::string_view to_string(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::invalid_argument:
      return "invalid_argument";
    case ErrorCode::unsupported:
      return "unsupported";
    case ErrorCode::unavailable:
      return "unavailable";
    case ErrorCode::mismatch:
      return "mismatch";
    case ErrorCode::timeout:
      return "timeout";
    case ErrorCode::backend_failure:
      return "backend_failure";
    case ErrorCode::cancelled:
      return "cancelled";
    case ErrorCode::out_of_memory:
      return "out_of_memory";
    case ErrorCode::graph_invalid:
      return "graph_invalid";
    case ErrorCode::node_failed:
      return "node_failed";
    case ErrorCode::peer_failed:
      return "peer_failed";
    case ErrorCode::internal:
      return "internal";
  }
  return "unknown";
}

Error::Error(ErrorCode code, const std::string& message)
    : std::runtime_error("[loom:" + std::string(to_string(code)) + "] " + message),
      _code(code),
      _message(message) {}

}  // namespace loom
