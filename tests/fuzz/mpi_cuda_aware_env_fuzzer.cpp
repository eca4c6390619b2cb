// Fuzzes LOOM_MPI_CUDA_AWARE through MpiConfig::from_env(): only "0" and "1" are accepted
// (empty keeps the default, on); anything else is invalid_argument naming the variable.
#include "fuzz/fuzz_env.hpp"
#include "loom/error.hpp"
#include "loom/mpi.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace loom::fuzz;
  const std::string text = env_text(data, size);
  ScopedEnv variable("LOOM_MPI_CUDA_AWARE", text.c_str());
  try {
    const loom::MpiConfig config = loom::MpiConfig::from_env();
    const bool expected = text != "0";
    if (text != "0" && text != "1" && !text.empty()) contract_broken("accepted a bad value", text);
    if (config.use_cuda_aware != expected) contract_broken("wrong setting", text);
  } catch (const loom::Error& e) {
    if (e.code() != loom::ErrorCode::invalid_argument)
      contract_broken("wrong code " + std::string(loom::to_string(e.code())), text);
    if (!contains(e.message(), "LOOM_MPI_CUDA_AWARE='" + text + "'"))
      contract_broken("the message does not quote the variable: " + e.message(), text);
  }
  return 0;
}
