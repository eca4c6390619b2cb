// One rank of a faulty MPI job, run by run_mpi_fault.py under mpirun: the last rank either
// SIGKILLs itself inside a compute node ("kill") or throws there ("throw") at step 3 while the
// others are inside Executor::run(). Each rank prints one "loom-fault:" line saying how its
// run ended, then leaves without MPI_Finalize (its peers may be dead or stuck).
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "faults/training_step.hpp"
#include "loom/error.hpp"
#include "loom/executor.hpp"

namespace {

constexpr long failing_step = 3, steps = 50;
constexpr const char* failing_node = "backward1";

// Exit statuses the driver checks.
constexpr int exit_loom_error = 3, exit_other_error = 4, exit_finished = 5, exit_usage = 2;

std::string one_line(std::string text) {
  for (char& c : text)
    if (c == '\n') c = ' ';
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 || (std::strcmp(argv[1], "kill") != 0 && std::strcmp(argv[1], "throw") != 0)) {
    std::fprintf(stderr, "usage: fault_mpi kill|throw\n");
    return exit_usage;
  }
  const bool kill = std::strcmp(argv[1], "kill") == 0;
  using Clock = std::chrono::steady_clock;
  int rank = -1;
  try {
    auto backend = loom::create_backend("mpi");
    rank = backend->rank();
    const int victim = backend->world_size() - 1;
    loom::PinnedPool pool({.cap_bytes = 64 << 20, .lock = false});
    loom::test::TrainingStep step(*backend, {5, 1001, 30011}, pool);
    step.on_compute = [&](std::string_view node) {
      if (rank != victim || step.step != failing_step || node != failing_node) return;
      std::printf("loom-fault: rank %d step %ld: %s in node '%s'\n", rank, step.step,
                  kill ? "SIGKILL to myself" : "throwing", failing_node);
      std::fflush(stdout);
      if (kill) ::raise(SIGKILL);
      throw std::runtime_error("injected failure");
    };
    // The watchdog comes from LOOM_TIMEOUT_S, as in a real job.
    loom::Executor ex(step.graph, *backend);
    for (step.step = 0; step.step < steps; ++step.step) {
      step.check = step.step < failing_step;
      const auto start = Clock::now();
      try {
        ex.run();
      } catch (const loom::Error& e) {
        const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
        std::printf("loom-fault: rank %d step %ld: error code=%s elapsed_s=%.3f wrong=%ld: %s\n",
                    rank, step.step, std::string(loom::to_string(e.code())).c_str(), elapsed,
                    step.wrong.load(), one_line(e.message()).c_str());
        std::fflush(stdout);
        std::_Exit(exit_loom_error);
      }
    }
    std::printf("loom-fault: rank %d finished %ld steps without an error\n", rank, steps);
    std::fflush(stdout);
    std::_Exit(exit_finished);
  } catch (const std::exception& e) {
    std::printf("loom-fault: rank %d: unexpected exception: %s\n", rank,
                one_line(e.what()).c_str());
    std::fflush(stdout);
    std::_Exit(exit_other_error);
  }
}
