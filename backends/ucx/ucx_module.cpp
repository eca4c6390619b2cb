// libloom_backend_ucx.so: registers "ucx" with loom's backend registry when loaded (create_backend
// loads it the first time LOOM_BACKEND=ucx, or a program's create_backend("ucx"), asks for it).
// The module sits above every layer of libloom, so it hands the backend loom's algorithms.
#include "loom/algorithm.hpp"
#include "loom/backend.hpp"
#include "ucx_backend.hpp"

namespace {

const bool registered = [] {
  loom::register_backend("ucx", [](const loom::BackendSetup& setup) {
    return loom::ucx::make_ucx_backend(setup, &loom::start_on_algorithms);
  });
  return true;
}();

}  // namespace
