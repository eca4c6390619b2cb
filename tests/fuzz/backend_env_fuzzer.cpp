// Fuzzes LOOM_BACKEND through create_backend(): "local" (or empty: the default outside mpirun)
// gives the one-rank local backend; a known backend this build lacks (nccl, ucx) is unavailable
// and anything else an invalid argument, each naming the value and the choices; ucx where its
// module is built asks for a store.
#include <memory>

#include "fuzz/fuzz_env.hpp"
#include "loom/backend.hpp"
#include "loom/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace loom::fuzz;
  const std::string text = env_text(data, size);
  // "mpi" would initialise MPI inside the fuzzer, which cannot be undone per input; the MPI
  // tests cover that path.
  if (text == "mpi") return 0;
  ScopedEnv variable("LOOM_BACKEND", text.c_str());
  try {
    auto backend = loom::create_backend();
    if (!text.empty() && text != "local") contract_broken("accepted an unknown backend", text);
    if (backend->name() != "local" || backend->world_size() != 1 || backend->rank() != 0)
      contract_broken("not a one-rank local backend", text);
  } catch (const loom::Error& e) {
    // ucx where its module is built: refused for want of a store (LOOM_STORE unset here).
    if (text == "ucx" && e.code() == loom::ErrorCode::invalid_argument &&
        contains(e.message(), "LOOM_STORE"))
      return 0;
    const bool known = text == "nccl" || text == "ucx";  // loom's, not built into this one
    const auto expected = known ? loom::ErrorCode::unavailable : loom::ErrorCode::invalid_argument;
    if (e.code() != expected)
      contract_broken("wrong code " + std::string(loom::to_string(e.code())), text);
    if (!contains(e.message(), "'" + text + "'") ||
        !contains(e.message(), "available in this build: local"))
      contract_broken("the message does not name the value and the choices: " + e.message(), text);
  }
  return 0;
}
