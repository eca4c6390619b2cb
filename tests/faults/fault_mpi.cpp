// One rank of a faulty MPI job, run by run_mpi_fault.py under mpirun: the last rank (the
// victim) injects one fault of the matrix (see usage()); every rank prints "loom-fault:" lines
// saying how it ended, then returns from main normally, so that teardown (executor, backend,
// MPI) is exercised too: it must not block, and it must end the process with a non-zero
// status. A victim that injects a fault first prints the wall-clock time it did so.
#include <signal.h>
#include <stdlib.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "faults/training_step.hpp"
#include "loom/error.hpp"
#include "loom/executor.hpp"
#include "loom/gradient_reducer.hpp"
#include "loom/reducer_prediction.hpp"
#include "scoped_env.hpp"

namespace {

constexpr long failing_step = 3, steps = 50;
constexpr const char* failing_node = "backward1";
// stop-graph stops in the step's first backward node, before which none of the step's
// collectives can be issued. In backward1 the stop raced allreduce2, ready at the same moment:
// when the issue won, rank 2 had started collective #13 on the rank board and the survivors
// rightly reported it inside the collective, not missing.
constexpr const char* stop_node = "backward2";

// Exit statuses the driver checks.
constexpr int exit_loom_error = 3, exit_other_error = 4, exit_finished = 5, exit_usage = 2;

const char* const modes[] = {"stop-graph",     "stop-blocking",   "stop-compile", "stop-agree",
                             "stop-shortlist", "stop-decide",     "kill",         "skip",
                             "reorder",        "priority",        "tuning",       "throw",
                             "bad-count",      "bad-count-graph", "stop-create"};

int usage() {
  std::fprintf(stderr, "usage: fault_mpi MODE, MODE one of:");
  for (const char* m : modes) std::fprintf(stderr, " %s", m);
  std::fprintf(stderr, "\n");
  return exit_usage;
}

std::string one_line(std::string text) {
  for (char& c : text)
    if (c == '\n') c = ' ';
  return text;
}

double wall_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void announce(int rank, long step, const char* what) {
  std::printf("loom-fault: rank %d step %ld: fault at %.3f: %s\n", rank, step, wall_s(), what);
  std::fflush(stdout);
}

// Two collectives of the same shape, unordered by edges: the issue order comes from priority,
// then insertion order. `variant` changes it on the victim.
struct TwoCollectives {
  std::vector<float> a = std::vector<float>(1024, 1.0f), b = std::vector<float>(1024, 2.0f);
  loom::Graph graph;
  TwoCollectives(const std::string& variant, bool victim) {
    auto fill = graph.compute("fill", [] {});
    loom::CommOptions first, second;
    if (victim && variant == "priority") second.priority = 1;
    auto ra = graph.allreduce("grad.a", loom::Buffer::of(std::span(a)), loom::ReduceOp::sum, first);
    fill.precede(ra);
    if (!(victim && variant == "skip")) {
      auto rb =
          graph.allreduce("grad.b", loom::Buffer::of(std::span(b)), loom::ReduceOp::sum, second);
      fill.precede(rb);
      if (victim && variant == "reorder") rb.precede(ra);  // one extra edge on this rank
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return usage();
  const std::string mode = argv[1];
  bool known = false;
  for (const char* m : modes) known = known || mode == m;
  if (!known) return usage();
  using Clock = std::chrono::steady_clock;
  int rank = -1;
  long step_now = -1;
  const auto start = Clock::now();
  try {
    auto backend = loom::create_backend("mpi");
    rank = backend->rank();
    const bool victim = rank == backend->world_size() - 1;
    if (mode == "stop-create") {
      // A second backend (as a GradientReducer makes one) that the victim never makes: the
      // others wait in its MPI_Comm_dup, which only the construction watch can end.
      if (victim) {
        announce(rank, 0, "SIGSTOP to myself before making a second backend");
        ::raise(SIGSTOP);
      }
      auto second = loom::create_backend("mpi");
      std::printf("rank %d made a second backend without the victim\n", rank);
      return exit_finished;
    }
    loom::PinnedPool pool({.cap_bytes = 64 << 20, .lock = false});
    std::unique_ptr<loom::Executor> ex;
    std::unique_ptr<TwoCollectives> two;
    loom::test::TrainingStep step(*backend, {5, 1001, 30011}, pool);
    if (mode == "skip" || mode == "reorder" || mode == "priority" || mode == "tuning") {
      // Each of these makes the victim's compiled sequence differ: compile's cross-rank check
      // must refuse on every rank, naming the first difference.
      std::optional<loom::test::ScopedEnv> tuning;
      if (victim && mode == "tuning") tuning.emplace("LOOM_ALLREDUCE", "ring:0-max");
      two = std::make_unique<TwoCollectives>(mode, victim);
      if (victim) announce(rank, 0, ("compiling a different graph: " + mode).c_str());
      ex = std::make_unique<loom::Executor>(two->graph, *backend);
      for (int k = 0; k < 3; ++k) ex->run();
      std::printf("loom-fault: rank %d finished without an error\n", rank);
      std::fflush(stdout);
      return exit_finished;
    }
    if (mode == "stop-agree") {
      // Backend::agree_on_root, the agreement every planner uses (bucket orders, plans): the
      // victim stops before it; the others must get a timeout naming it, not hang.
      if (victim) {
        announce(rank, 0, "SIGSTOP to myself before agree_on_root");
        ::raise(SIGSTOP);
      }
      const std::vector<std::int64_t> mine = {7, 11, 13};
      const auto limit = std::chrono::duration_cast<std::chrono::nanoseconds>(
          *loom::ExecutorOptions{}.resolved().timeout);
      backend->agree_on_root("fault.agree", mine, limit,
                             [&] { return "agree_on_root on rank " + std::to_string(rank); });
      std::printf("loom-fault: rank %d finished without an error\n", rank);
      std::fflush(stdout);
      return exit_finished;
    }
    if (mode == "stop-shortlist" || mode == "stop-decide") {
      // bucket_cap_mb="auto"'s two agreements (GradientReducer): rank 0's shortlist of plans and
      // its steps of their trials. The victim stops before one; the others must get a
      // timeout naming it there, not hang. Rank 0 has no profiled steps: its prediction fails,
      // and the agreement still waits for every rank before anyone reports it.
      std::vector<loom::ParameterSpec> params;
      for (int l = 0; l < 3; ++l)
        params.push_back(
            {"layers." + std::to_string(l) + ".weight", "layers." + std::to_string(l), 1000});
      loom::ReducerPlan plan;
      plan.bucket_cap_bytes = std::size_t{1} << 20;
      plan.first_bucket_bytes = plan.bucket_cap_bytes;
      loom::GradientReducer reducer(params, *backend, plan);
      if (mode == "stop-shortlist") {
        if (victim) {
          announce(rank, 0, "SIGSTOP to myself before shortlist_reducer_plans");
          ::raise(SIGSTOP);
        }
        loom::shortlist_reducer_plans(reducer, {}, loom::PlanSearch::for_gradient_reducer(), 3);
      } else {
        loom::PlanShortlist shortlist;
        shortlist.plans.push_back({.plan = reducer.plan()});
        if (victim) {
          announce(rank, 0, "SIGSTOP to myself before decide_reducer_plan");
          ::raise(SIGSTOP);
        }
        const double measured[] = {0.1};
        loom::decide_reducer_plan(reducer, shortlist, measured);
      }
      std::printf("loom-fault: rank %d finished without an error\n", rank);
      std::fflush(stdout);
      return exit_finished;
    }
    if (victim && mode == "stop-compile") {
      announce(rank, 0, "SIGSTOP to myself before compile");
      ::raise(SIGSTOP);
    }
    if (victim && mode == "bad-count-graph") {
      // An allreduce whose recv count differs from its send count: this rank's graph fails
      // validation at compile, alone; the others wait for it in the cross-rank check.
      static std::vector<float> send(8), recv(4);
      step.graph.allreduce("bad.allreduce", loom::Buffer::of(std::span(send)),
                           loom::Buffer::of(std::span(recv)));
      announce(rank, 0, "compiling a graph with a bad count");
    }
    step.on_compute = [&](std::string_view node) {
      if (!victim || step.step != failing_step) return;
      if (mode == "stop-graph") {
        if (node != stop_node) return;
        announce(rank, step.step, "SIGSTOP to myself in node 'backward2'");
        ::raise(SIGSTOP);
      }
      if (node != failing_node) return;
      if (mode == "kill") {
        announce(rank, step.step, "SIGKILL to myself in node 'backward1'");
        ::raise(SIGKILL);
      } else if (mode == "throw") {
        announce(rank, step.step, "throwing in node 'backward1'");
        throw std::runtime_error("injected failure");
      }
    };
    ex = std::make_unique<loom::Executor>(step.graph, *backend);  // watchdog: LOOM_TIMEOUT_S
    for (step.step = 0; step.step < steps; ++step.step) {
      step_now = step.step;
      step.check = step.step < failing_step;
      ex->run();
      // A blocking call outside the graph, as the demo's loss average: watched too.
      float loss = 1.0f;
      float too_short[1];
      if (victim && step.step == failing_step && mode == "stop-blocking") {
        announce(rank, step.step, "SIGSTOP to myself before the blocking allreduce");
        ::raise(SIGSTOP);
      }
      if (victim && step.step == failing_step && mode == "bad-count") {
        announce(rank, step.step, "a blocking allreduce with a bad count");
        float two_values[2] = {1, 1};
        backend->allreduce(loom::Buffer(two_values, 2, loom::DType::float32),
                           loom::Buffer(too_short, 1, loom::DType::float32), loom::ReduceOp::sum);
      }
      backend->allreduce(loom::Buffer(&loss, 1, loom::DType::float32), loom::ReduceOp::avg);
    }
    std::printf("loom-fault: rank %d finished %ld steps without an error\n", rank, steps);
    std::fflush(stdout);
    return exit_finished;
  } catch (const loom::Error& e) {
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    std::printf("loom-fault: rank %d step %ld: error at %.3f (%.3f s after start): %s\n", rank,
                step_now, wall_s(), elapsed, one_line(e.what()).c_str());
    std::fflush(stdout);
    return exit_loom_error;  // through every destructor: teardown must not block
  } catch (const std::exception& e) {
    std::printf("loom-fault: rank %d: unexpected exception: %s\n", rank,
                one_line(e.what()).c_str());
    std::fflush(stdout);
    return exit_other_error;
  }
}
