// ScopedEnv: sets (or, with nullptr, unsets) an environment variable for one scope, then puts
// back what was there before. Shared by the tests that steer loom through LOOM_* variables.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace loom::test {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : _name(name) {
    if (const char* before = std::getenv(name)) _saved = before;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (_saved)
      ::setenv(_name, _saved->c_str(), 1);
    else
      ::unsetenv(_name);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* _name;
  std::optional<std::string> _saved;
};

}  // namespace loom::test
