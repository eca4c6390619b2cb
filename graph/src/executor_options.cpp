// ExecutorOptions: the options' unset fields filled from the environment (LOOM_TIMEOUT_S,
// LOOM_TRACE, LOOM_PROGRESS_PRIORITY) by the rules of loom/environment.hpp.
#include <cmath>

#include "loom/environment.hpp"
#include "loom/error.hpp"
#include "loom/executor.hpp"
#include "loom/progress_priority.hpp"

namespace loom {

ExecutorOptions ExecutorOptions::resolved() const {
  ExecutorOptions out = *this;
  if (!out.timeout) {
    out.timeout = std::chrono::duration<double>(
        environment::seconds("LOOM_TIMEOUT_S").value_or(environment::default_timeout_s));
  } else {
    // Throws for a negative or non-finite timeout, naming the option.
    environment::timeout_from_seconds(out.timeout->count(), "ExecutorOptions::timeout");
  }
  if (!out.trace_path) out.trace_path = environment::text("LOOM_TRACE");
  if (!out.profile) out.profile = out.trace_path.has_value();
  if (!out.progress_priority) out.progress_priority = progress_priority_from_environment();
  return out;
}

}  // namespace loom
