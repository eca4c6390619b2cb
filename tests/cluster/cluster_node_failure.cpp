// One rank of a job whose last node is stopped or killed from outside (node_failure.sh): an
// Executor runs a one-allreduce graph in a loop (checking every result) until a run fails.
// Prints "loom-node-failure: rank R ready (pid P)" once 5 runs completed, and on the failure
// "loom-node-failure: rank R error at <wall-clock s>: [loom:<code>] <message>"; exits 3 on a
// loom::Error, 5 when 60 s passed without one, 4 on anything else.
// With the argument `inside`, the last rank stops itself (SIGSTOP) inside the allreduce of run 8:
// there every other rank holds its allreduce back 2 s in a compute node before it, while the last
// rank issues it at once and, from a compute node beside it, waits until its rank board shows the
// collective started, then stops, so it has started the collective and cannot complete it. It
// prints "loom-node-failure: rank R stops inside collective at <wall-clock s> (pid P)" first.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>

#include <chrono>
#include <cstdio>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "loom/backend.hpp"
#include "loom/error.hpp"
#include "loom/executor.hpp"
#include "loom/graph.hpp"
#include "loom/rank_board.hpp"

namespace {

double wall_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string one_line(std::string text) {
  for (char& c : text)
    if (c == '\n') c = ' ';
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  const bool inside = argc > 1 && std::strcmp(argv[1], "inside") == 0;
  int rank = -1;
  try {
    auto backend = loom::create_backend("mpi");
    rank = backend->rank();
    const int world = backend->world_size();
    std::vector<float> send(4096), recv(4096);
    std::atomic<long> current_run{0};
    std::atomic<std::int64_t> started_before{0};  // the collective the stop run starts
    constexpr long stop_run = 8;
    const bool last = rank == world - 1;
    loom::Graph graph;
    auto allreduce = graph.allreduce("node_failure.allreduce", loom::Buffer::of(std::span(send)),
                                     loom::Buffer::of(std::span(recv)));
    if (inside) {
      auto hold = graph.compute("node_failure.hold", [&] {
        if (current_run == stop_run && !last) std::this_thread::sleep_for(std::chrono::seconds(2));
      });
      hold.precede(allreduce);
      graph.compute("node_failure.stopper", [&] {
        if (current_run != stop_run || !last) return;
        // Started on the board: the executor issued this run's allreduce (at most 10 s).
        const loom::RankBoard* board = backend->rank_board();
        for (int k = 0; k < 10000 && board->read(rank).last_started < started_before; ++k)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        std::printf("loom-node-failure: rank %d stops inside collective at %.3f (pid %d)\n", rank,
                    wall_s(), static_cast<int>(getpid()));
        std::fflush(stdout);
        raise(SIGSTOP);
      });
    }
    loom::Executor executor(graph, *backend);  // its timeout: LOOM_TIMEOUT_S
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (long run = 0; std::chrono::steady_clock::now() < until; ++run) {
      current_run = run;
      if (const loom::RankBoard* board = backend->rank_board())
        started_before = board->read(rank).last_started + 1;
      for (std::size_t i = 0; i < send.size(); ++i)
        send[i] = static_cast<float>((rank + 1) * (i % 7 + run % 3));
      executor.run();
      // sum over r of (r + 1) = world (world + 1) / 2
      for (std::size_t i = 0; i < recv.size(); ++i)
        if (recv[i] != static_cast<float>(world * (world + 1) / 2 * (i % 7 + run % 3))) {
          std::printf("loom-node-failure: rank %d: wrong result at %zu in run %ld\n", rank, i, run);
          return 4;
        }
      if (run == 5) {
        std::printf("loom-node-failure: rank %d ready (pid %d)\n", rank,
                    static_cast<int>(getpid()));
        std::fflush(stdout);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::printf("loom-node-failure: rank %d finished without an error\n", rank);
    return 5;
  } catch (const loom::Error& e) {
    std::printf("loom-node-failure: rank %d error at %.3f: %s\n", rank, wall_s(),
                one_line(e.what()).c_str());
    std::fflush(stdout);
    return 3;
  } catch (const std::exception& e) {
    std::printf("loom-node-failure: rank %d: unexpected exception: %s\n", rank,
                one_line(e.what()).c_str());
    return 4;
  }
}
