// Helpers shared by the libFuzzer targets: the input as an environment value, a scoped
// variable (tests/scoped_env.hpp), and a loud failure when a parser breaks its contract.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "scoped_env.hpp"

namespace loom::fuzz {

/// @brief The input up to its first NUL: an environment value cannot hold one.
inline std::string env_text(const std::uint8_t* data, std::size_t size) {
  const auto* text = reinterpret_cast<const char*>(data);
  return std::string(text, strnlen(text, size));
}

/// @brief Sets a variable for the scope of one input, then restores it (the tests' own).
using ScopedEnv = test::ScopedEnv;

/// @brief Reports a broken contract as a crash, which libFuzzer records with the input.
[[noreturn]] inline void contract_broken(const std::string& what, const std::string& input) {
  std::fprintf(stderr, "fuzz: contract broken for input '%s': %s\n", input.c_str(), what.c_str());
  std::abort();
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace loom::fuzz
