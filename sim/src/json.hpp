// Json: the small JSON reader the step profile needs (objects, arrays, strings, numbers, bools).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace loom::sim {

/// @brief A parsed JSON value.
struct Json {
  enum class Type : unsigned char { null, boolean, number, string, array, object };
  Type type = Type::null;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<Json> array;
  std::map<std::string, Json, std::less<>> object;

  /// @brief The member `key` of an object; ErrorCode::invalid_argument naming `key` otherwise.
  const Json& at(std::string_view key) const;
  /// @brief The member `key`, or nullptr.
  const Json* find(std::string_view key) const;
  double as_number(std::string_view what) const;
  const std::string& as_string(std::string_view what) const;
  const std::vector<Json>& as_array(std::string_view what) const;
};

/// @brief Parses `text`; ErrorCode::invalid_argument naming the offset of the first error.
Json parse_json(std::string_view text);

}  // namespace loom::sim
