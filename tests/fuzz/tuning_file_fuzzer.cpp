// Fuzzes parse_tuning_file (LOOM_TUNING_FILE's format): any text either parses, and then
// formats and parses back to the same text, or is refused with invalid_argument
// that says it is the tuning file (and names the line where there is one).
#include <string>

#include "fuzz/fuzz_env.hpp"
#include "loom/error.hpp"
#include "loom/tuning.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace loom::fuzz;
  const std::string text(reinterpret_cast<const char*>(data), size);
  loom::TuningParameters parsed;
  try {
    parsed = loom::parse_tuning_file(text);
  } catch (const loom::Error& e) {
    if (e.code() != loom::ErrorCode::invalid_argument)
      contract_broken("wrong code " + std::string(loom::to_string(e.code())), text);
    if (!contains(e.message(), "tuning file"))
      contract_broken("the message does not say it is the tuning file: " + e.message(), text);
    return 0;
  }
  // What was accepted must survive a round trip through the writer unchanged.
  const std::string once = loom::format_tuning_file(parsed);
  std::string twice;
  try {
    twice = loom::format_tuning_file(loom::parse_tuning_file(once));
  } catch (const loom::Error& e) {
    contract_broken("format_tuning_file wrote text its parser refuses: " + e.message(), text);
  }
  if (once != twice) contract_broken("the round trip changed the parameters", text);
  return 0;
}
