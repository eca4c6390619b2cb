// Fuzzes LOOM_TIMEOUT_S through ExecutorOptions::resolved(): a value is accepted only when it is
// a whole finite decimal number >= 0 (checked against strtod), else invalid_argument naming it.
// An accepted value then arms the watchdog of a real run (one allreduce on a local rank), so
// huge or tiny values must work there too.
#include <cmath>
#include <cstdlib>
#include <vector>

#include "fuzz/fuzz_env.hpp"
#include "loom/error.hpp"
#include "loom/executor.hpp"
#include "loom/local.hpp"

namespace {

void run_with_watchdog(const std::string& text) {
  static auto backend = loom::make_local_backend();
  std::vector<float> values{1.5F, -2.0F, 3.25F};
  loom::Graph graph;
  graph.allreduce("reduce", loom::Buffer::of(std::span(values)));
  loom::Executor ex(graph, *backend);
  ex.run();
  if (values != std::vector<float>{1.5F, -2.0F, 3.25F})
    loom::fuzz::contract_broken("a one-rank allreduce changed the values", text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace loom::fuzz;
  const std::string text = env_text(data, size);
  ScopedEnv variable("LOOM_TIMEOUT_S", text.c_str());
  try {
    const double seconds = loom::ExecutorOptions{}.resolved().timeout->count();
    if (text.empty()) {
      if (seconds != 300) contract_broken("unset must give the 300 s default", text);
      return 0;
    }
    char* end = nullptr;
    const double reference = std::strtod(text.c_str(), &end);
    if (!std::isfinite(seconds) || seconds < 0) contract_broken("accepted a bad value", text);
    if (*end != '\0' || reference != seconds)
      contract_broken("accepted, but strtod reads it differently", text);
    // A watchdog under 1 s could rightly fire on a loaded machine before the allreduce ends.
    if (seconds == 0 || seconds >= 1) run_with_watchdog(text);
  } catch (const loom::Error& e) {
    if (e.code() != loom::ErrorCode::invalid_argument)
      contract_broken("wrong code " + std::string(loom::to_string(e.code())), text);
    if (!contains(e.message(), "LOOM_TIMEOUT_S='" + text + "'"))
      contract_broken("the message does not quote the variable: " + e.message(), text);
  }
  return 0;
}
