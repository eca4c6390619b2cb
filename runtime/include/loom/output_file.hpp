// Output files loom and its tools write (traces, DOT graphs, profiles, tuning files): opened,
// or refused with a loom::Error that names the file and the system's reason.
#pragma once

#include <fstream>
#include <string>
#include <string_view>

namespace loom {

/// @brief Opens `path` for writing (truncating it). Throws Error(invalid_argument)
/// "cannot write the <what> '<path>': <the system's reason>" (e.g. "No such file or directory")
/// if it cannot be opened.
std::ofstream open_output_file(const std::string& path, std::string_view what);

/// @brief Closes `out` and throws as open_output_file() does if anything written to it failed
/// (a full disk): the file is then incomplete.
void close_output_file(std::ofstream& out, const std::string& path, std::string_view what);

}  // namespace loom
