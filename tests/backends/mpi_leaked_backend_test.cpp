// A backend still alive when the process exits (after an exception, a Python object that holds
// a loom_torch reducer is never collected) must not touch its shared board once MPI_Finalize
// has freed the board's window: its heartbeat thread beat into the freed memory and the process
// died of SIGSEGV at exit. Here the backend is leaked on purpose, and an exit handler registered
// before loom's MPI runtime exists (so it runs after the runtime's destructor, which finalises
// MPI) waits four heartbeat periods with the leaked backend's thread still running. The test
// passes when every rank exits with status 0.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include "loom/backend.hpp"
#include "loom/error.hpp"

// External linkage: the store below cannot be optimised away.
extern std::shared_ptr<loom::Backend>* kept_alive;
std::shared_ptr<loom::Backend>* kept_alive = nullptr;

namespace {

void linger_after_finalize() {
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
}

}  // namespace

int main() {
  std::atexit(linger_after_finalize);  // before any static of loom's: it runs after them
  try {
    auto backend = loom::create_backend("mpi");
    std::vector<float> values(7, 1.0f);
    backend->allreduce(loom::Buffer::of(std::span(values)), loom::ReduceOp::sum);
    if (values[0] != static_cast<float>(backend->world_size())) {
      std::fprintf(stderr, "allreduce gave %g on rank %d, not %d\n", values[0], backend->rank(),
                   backend->world_size());
      return 1;
    }
    std::printf("rank %d leaves its backend alive at exit\n", backend->rank());
    // Never destroyed, its heartbeat thread still running; held by a global, so that
    // LeakSanitizer counts it reachable rather than leaked.
    kept_alive = new std::shared_ptr<loom::Backend>(backend);
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
