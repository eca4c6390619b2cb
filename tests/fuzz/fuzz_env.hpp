// Helpers shared by the libFuzzer targets: the input as an environment value, a scoped
// variable, and a loud failure when a parser breaks its contract.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

namespace loom::fuzz {

/// @brief The input up to its first NUL: an environment value cannot hold one.
inline std::string env_text(const std::uint8_t* data, std::size_t size) {
  const auto* text = reinterpret_cast<const char*>(data);
  return std::string(text, strnlen(text, size));
}

/// @brief Sets a variable for the scope of one input, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : _name(name) {
    if (const char* old = std::getenv(name)) _old = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (_old)
      ::setenv(_name, _old->c_str(), 1);
    else
      ::unsetenv(_name);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* _name;
  std::optional<std::string> _old;
};

/// @brief Reports a broken contract as a crash, which libFuzzer records with the input.
[[noreturn]] inline void contract_broken(const std::string& what, const std::string& input) {
  std::fprintf(stderr, "fuzz: contract broken for input '%s': %s\n", input.c_str(), what.c_str());
  std::abort();
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace loom::fuzz
