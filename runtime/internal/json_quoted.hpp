// json_quoted: a string as a JSON string literal, as the flight record, the executor's trace and
// the step profile write it (private to the library, not part of the public API).
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace loom {

/// @brief How a JSON string literal writes newline and tab; the other control characters are
/// always \u00XX.
enum class JsonControl {
  unicode,            ///< \u000a and \u0009
  short_newline_tab,  ///< \n and \t
};

/// @brief Appends `text` to `out` as a JSON string literal, quotes included: '"' and '\'
/// backslash-escaped, control characters as \u00XX (or newline and tab as `control` says), every
/// other byte as it is.
inline void append_json_quoted(std::string& out, std::string_view text,
                               JsonControl control = JsonControl::unicode) {
  out += '"';
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (control == JsonControl::short_newline_tab && c == '\n') {
      out += "\\n";
    } else if (control == JsonControl::short_newline_tab && c == '\t') {
      out += "\\t";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned char>(c));
      out += escaped;
    } else {
      out += c;
    }
  }
  out += '"';
}

/// @brief `text` as a JSON string literal (see append_json_quoted).
inline std::string json_quoted(std::string_view text, JsonControl control = JsonControl::unicode) {
  std::string out;
  append_json_quoted(out, text, control);
  return out;
}

}  // namespace loom
