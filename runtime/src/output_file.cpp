// Output files: the system's reason in the error, read from errno right after the failing call.
#include "loom/output_file.hpp"

#include <cerrno>
#include <system_error>

#include "loom/error.hpp"

namespace loom {
namespace {

Error cannot_write(const std::string& path, std::string_view what, int error,
                   const char* unknown = "") {
  return Error(ErrorCode::invalid_argument,
               "cannot write the " + std::string(what) + " '" + path + "'" +
                   (error ? ": " + std::generic_category().message(error) : unknown));
}

}  // namespace

std::ofstream open_output_file(const std::string& path, std::string_view what) {
  errno = 0;
  std::ofstream out(path);
  if (!out) throw cannot_write(path, what, errno);
  return out;
}

void close_output_file(std::ofstream& out, const std::string& path, std::string_view what) {
  // A write that failed earlier (its buffer filled) left no reason loom can still trust.
  const bool failed_before = !out;
  errno = 0;
  out.close();
  if (failed_before || !out)
    throw cannot_write(path, what, failed_before ? 0 : errno, ": a write to it failed");
}

}  // namespace loom
