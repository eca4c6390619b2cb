// graph_quickstart: one training-like step as a loom Graph (compute -> allreduce -> compute)
// on 2 ranks, run a few times, then written out as step.dot (Graphviz) and trace.json
// (Perfetto). Runs 2 local ranks as threads, or one rank per process under mpirun:
//   ./loom-graph-quickstart            mpirun -np 2 ./loom-graph-quickstart
#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <vector>

#include "loom/error.hpp"
#include "loom/executor.hpp"
#include "loom/graph.hpp"
#include "loom/local.hpp"
#include "loom/output_file.hpp"

namespace {

constexpr std::size_t parameters = 1 << 16;
constexpr int steps = 5;

// Every rank computes a gradient, the allreduce averages it, and every rank applies it.
int step_on(loom::Backend& backend) {
  std::vector<float> weights(parameters, 1.0f), grads(parameters), bias_grads(256);
  const auto grads_buffer = loom::Buffer::of(std::span(grads));
  const auto bias_buffer = loom::Buffer::of(std::span(bias_grads));
  const float rank = static_cast<float>(backend.rank());
  const int world = backend.world_size();

  loom::Graph g;
  auto forward = g.compute("forward_backward",
                           [&] {
                             for (std::size_t i = 0; i < grads.size(); ++i) grads[i] = rank + 1.0f;
                           },
                           {.writes = {grads_buffer}});
  auto bias = g.compute("bias_backward",
                        [&] {
                          for (auto& b : bias_grads) b = 2.0f * (rank + 1.0f);
                        },
                        {.writes = {bias_buffer}});
  auto reduce = g.allreduce("allreduce_grads", grads_buffer, loom::ReduceOp::avg);
  auto reduce_bias =
      g.allreduce("allreduce_bias", bias_buffer, loom::ReduceOp::avg, {.priority = 1});
  auto update = g.compute("sgd_update",
                          [&] {
                            for (std::size_t i = 0; i < weights.size(); ++i)
                              weights[i] -= 0.1f * grads[i];
                          },
                          {.reads = {grads_buffer, bias_buffer}});
  forward.precede(reduce);
  bias.precede(reduce_bias);
  update.succeed(reduce, reduce_bias);

  if (backend.rank() == 0) {
    std::ofstream dot = loom::open_output_file("step_graph.dot", "DOT file");
    g.dump_dot(dot);  // the graph as built, before compile
  }

  loom::ExecutorOptions options;
  options.profile = true;  // durations in step.dot, timeline in trace.json
  loom::Executor executor(g, backend, options);
  executor.run(steps);

  // Mean of (r + 1) over ranks, applied `steps` times with learning rate 0.1.
  const float mean = (world + 1) / 2.0f;
  const float expected = 1.0f - steps * 0.1f * mean;
  if (std::fabs(weights[0] - expected) > 1e-4f || bias_grads[0] != 2.0f * mean) {
    std::fprintf(stderr, "rank %d: weights[0] = %f, expected %f\n", backend.rank(), weights[0],
                 expected);
    return 1;
  }
  if (backend.rank() == 0) {
    std::ofstream dot = loom::open_output_file("step.dot", "DOT file");
    executor.dump_dot(dot);
    executor.write_trace("trace.json");
    std::printf("%d ranks (%s), %d steps: weights[0] = %g as expected\n", world,
                std::string(backend.name()).c_str(), steps, weights[0]);
    std::printf("collective issue order:");
    for (const auto& name : executor.issue_order()) std::printf(" %s", name.c_str());
    std::printf(
        "\nwrote step.dot (dot -Tsvg step.dot -o step.svg) and trace.json "
        "(open in ui.perfetto.dev)\n");
  }
  return 0;
}

}  // namespace

int main() {
  try {
    if (loom::launched_by_mpirun()) {
      auto backend = loom::create_backend();
      return step_on(*backend);
    }
    std::atomic<int> failed{0};
    loom::LocalWorld::run(2, [&](loom::Backend& backend) { failed += step_on(backend); });
    return failed == 0 ? 0 : 1;
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "graph_quickstart: %s\n", e.what());
    return 1;
  }
}
