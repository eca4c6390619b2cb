// Fuzzes parse_collective(), the parser of collective names (the <COLL> of LOOM_<COLL>
// algorithm ranges): it accepts exactly the canonical names and "reducescatter".
#include "fuzz/fuzz_env.hpp"
#include "loom/backend.hpp"
#include "loom/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace loom::fuzz;
  const std::string text(reinterpret_cast<const char*>(data), size);  // NULs included
  try {
    const loom::Collective c = loom::parse_collective(text);
    if (loom::to_string(c) != text &&
        !(text == "reducescatter" && c == loom::Collective::reduce_scatter))
      contract_broken("accepted a name that is not the collective's", text);
  } catch (const loom::Error& e) {
    if (e.code() != loom::ErrorCode::invalid_argument)
      contract_broken("wrong code " + std::string(loom::to_string(e.code())), text);
    if (!contains(e.message(), "unknown collective '" + text + "'"))
      contract_broken("the message does not name the value: " + e.message(), text);
  }
  return 0;
}
