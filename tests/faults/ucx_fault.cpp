// A rank of a ucx job (started by run_ucx_fault.py without mpirun) that fails on purpose: the
// last rank kills (SIGKILL) or stops (SIGSTOP) itself inside a run of allreduces, while the
// others go on. Every survivor prints the loom::Error it got as "[loom:<code>] <message>" and
// exits 1; a survivor that completes every allreduce exits 0 (the driver fails the case).
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "loom/backend.hpp"
#include "loom/error.hpp"

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "kill" && mode != "stop") {
    std::fprintf(stderr, "usage: ucx_fault kill|stop\n");
    return 2;
  }
  try {
    auto backend = loom::create_backend("ucx");
    const int victim = backend->world_size() - 1;
    std::vector<float> data(16 * 1024 + 3, 1.0f);  // odd: the algorithms' uneven blocks
    for (int step = 0; step < 100000; ++step) {
      if (backend->rank() == victim && step == 50) {
        std::printf("loom-fault: rank %d step %d: %s\n", victim, step, mode.c_str());
        std::fflush(stdout);
        std::raise(mode == "kill" ? SIGKILL : SIGSTOP);
      }
      backend->allreduce(loom::Buffer(data.data(), data.size(), loom::DType::float32),
                         loom::ReduceOp::max);
    }
    std::printf("rank %d: every allreduce completed\n", backend->rank());
    return 0;
  } catch (const loom::Error& e) {
    std::printf("%s\n", e.what());
    std::fflush(stdout);
    return 1;
  }
}
