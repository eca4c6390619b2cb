// OverlapBenchmark: warm-ups, timed steps with per-step overlap metrics, medians, files.
#include "overlap_benchmark.hpp"

#include <algorithm>
#include <chrono>
#include <fstream>

#include "loom/error.hpp"
#include "overlap_metrics.hpp"

namespace loom::bench {

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : (v[h - 1] + v[h]) / 2;
}

}  // namespace

ModeResult run_mode(Backend& backend, examples::TrainConfig config, const RunPlan& plan) {
  config.executor.profile = true;
  examples::TrainStep step(backend, config);
  for (int w = 0; w < plan.warmups; ++w) {
    backend.barrier();
    step.run();
    if (w == 0 && plan.rebuild) step.rebuild_buckets();
  }
  std::vector<double> step_ms, compute, comm, hidden, exposed, efficiency;
  for (int s = 0; s < plan.steps; ++s) {
    backend.barrier();
    const auto start = std::chrono::steady_clock::now();
    step.run();
    double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    // The step took as long as its slowest rank.
    backend.allreduce(Buffer(&ms, 1, DType::float64), ReduceOp::max);
    const auto m = examples::measure_overlap(step.executor().last_run());
    step_ms.push_back(ms);
    compute.push_back(m.compute_ms);
    comm.push_back(m.comm_ms);
    hidden.push_back(m.hidden_ms);
    exposed.push_back(m.exposed_comm_ms);
    efficiency.push_back(m.overlap_efficiency);
  }
  if (backend.rank() == 0) {
    if (!plan.trace_path.empty()) step.executor().write_trace(plan.trace_path);
    if (!plan.dot_path.empty()) {
      std::ofstream dot(plan.dot_path);
      if (!dot)
        throw Error(ErrorCode::invalid_argument,
                    "cannot write the DOT file '" + plan.dot_path + "'");
      step.executor().dump_dot(dot);
    }
  }
  ModeResult r;
  r.mode = config.mode;
  r.ranks = backend.world_size();
  r.buckets = step.bucketer().buckets().size();
  r.step_ms = median(step_ms);
  r.compute_ms = median(compute);
  r.comm_ms = median(comm);
  r.hidden_ms = median(hidden);
  r.exposed_comm_ms = median(exposed);
  r.overlap_efficiency = median(efficiency);
  r.final_loss = step.loss();
  return r;
}

}  // namespace loom::bench
