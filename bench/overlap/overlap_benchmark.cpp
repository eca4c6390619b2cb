// OverlapBenchmark: warm-ups, timed steps with per-step overlap metrics, medians, files.
#include "overlap_benchmark.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <string>

#include "loom/error.hpp"
#include "loom/output_file.hpp"
#include "loom/overlap_metrics.hpp"
#include "loom/step_profile.hpp"
#include "loom/streaming_quantile.hpp"

namespace loom::bench {

namespace {

// CPU time of every thread of this process (the compute threads, the progress thread, MPI's).
double process_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) * 1e-6;
}

// The step profile is made from the last runs only: a fixed window, however many steps run.
constexpr std::size_t profile_window = 64;

}  // namespace

std::vector<ModeResult> run_modes(Backend& backend, std::vector<examples::TrainConfig> configs,
                                  const RunPlan& plan) {
  // Per mode: running medians (fixed memory however many steps) and the last runs' timelines.
  struct Samples {
    StreamingQuantile step_ms, cpu_ms, compute, comm, hidden, exposed, efficiency;
    std::vector<std::vector<NodeTiming>> runs;  // for the step profile, the last profile_window
  };
  std::vector<std::unique_ptr<examples::TrainStep>> steps;
  for (auto& config : configs) {
    config.executor.profile = true;
    steps.push_back(std::make_unique<examples::TrainStep>(backend, config));
  }
  for (int w = 0; w < plan.warmups; ++w)
    for (auto& step : steps) {
      backend.barrier();
      step->run();
      if (w == 0 && plan.rebuild) step->rebuild_buckets();
      // Planned from every warm-up but the last (a plan's own run measures the wire one bucket
      // at a time, which the next plan uses); the last warm-up runs the final plan.
      if (plan.schedule && w + 1 < plan.warmups) step->schedule_from_last_run();
    }
  std::vector<Samples> samples(steps.size());
  const int block = std::max(plan.block_steps, 1);
  std::vector<std::vector<NodeTiming>> block_runs(static_cast<std::size_t>(block));
  for (int s = 0; s < plan.steps; ++s) {
    for (std::size_t k = 0; k < steps.size(); ++k) {
      backend.barrier();
      // A block of block_steps runs back to back, as training runs them: the barrier aligns
      // the ranks before the block only, and each run's timeline is kept for after it.
      const double cpu0 = process_cpu_ms();
      const auto start = std::chrono::steady_clock::now();
      for (int b = 0; b < block; ++b) {
        steps[k]->run();
        // A copy of the run's timeline (tens of nodes: microseconds against a step's ms).
        if (b + 1 < block) block_runs[b] = steps[k]->executor().last_run();
      }
      double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count() /
          block;
      // The local backend's ranks are threads of this one process: its CPU time counts once.
      double cpu = backend.name() == "local" && backend.rank() != 0
                       ? 0.0
                       : (process_cpu_ms() - cpu0) / block;
      // The step took as long as its slowest rank; its CPU is every rank's.
      backend.allreduce(Buffer(&ms, 1, DType::float64), ReduceOp::max);
      backend.allreduce(Buffer(&cpu, 1, DType::float64), ReduceOp::sum);
      block_runs[block - 1] = steps[k]->executor().last_run();
      Samples& out = samples[k];
      out.step_ms.add(ms);
      out.cpu_ms.add(cpu);
      for (const auto& run : block_runs) {
        const auto m = measure_overlap(run);
        out.compute.add(m.compute_ms);
        out.comm.add(m.comm_ms);
        out.hidden.add(m.hidden_ms);
        out.exposed.add(m.exposed_comm_ms);
        out.efficiency.add(m.overlap_efficiency);
        if (plan.profile_prefix.empty()) continue;
        if (out.runs.size() == profile_window) out.runs.erase(out.runs.begin());
        out.runs.push_back(run);
      }
    }
  }
  if (backend.rank() == 0 && plan.files_from < steps.size()) {
    examples::TrainStep& step = *steps[plan.files_from];
    if (!plan.trace_path.empty()) step.executor().write_trace(plan.trace_path);
    if (!plan.dot_path.empty()) {
      std::ofstream dot = open_output_file(plan.dot_path, "DOT file");
      step.executor().dump_dot(dot);
      close_output_file(dot, plan.dot_path, "DOT file");
    }
  }
  std::vector<ModeResult> results;
  for (std::size_t k = 0; k < steps.size(); ++k) {
    const Samples& in = samples[k];
    ModeResult r;
    r.mode = configs[k].mode;
    r.label = k < plan.labels.size() ? plan.labels[k] : std::string(examples::to_string(r.mode));
    r.ranks = backend.world_size();
    r.buckets = steps[k]->bucketer().buckets().size();
    r.step_ms = in.step_ms.median();
    r.cpu_ms = in.cpu_ms.median();
    r.compute_ms = in.compute.median();
    r.comm_ms = in.comm.median();
    r.hidden_ms = in.hidden.median();
    r.exposed_comm_ms = in.exposed.median();
    r.overlap_efficiency = in.efficiency.median();
    r.final_loss = steps[k]->loss();
    r.progress_priority = steps[k]->executor().progress_priority();
    if (const examples::TimedPlan* p = steps[k]->plan()) {
      r.plan = examples::describe(*p);
      r.plans_tried = steps[k]->plans_tried();
    }
    r.communication =
        explain_communication(steps[k]->executor().last_run(), cores_per_rank(backend));
    results.push_back(r);
    if (!plan.profile_prefix.empty() && backend.rank() == 0) {
      StepProfile profile = profile_step(steps[k]->graph(), in.runs);
      const auto& shape = configs[k].shape;
      profile.label = "loom-overlap " + r.label + " mode, MLP " + std::to_string(shape.input) +
                      " -> " + std::to_string(shape.depth) + " x " + std::to_string(shape.width) +
                      " -> " + std::to_string(shape.output) + ", batch " +
                      std::to_string(shape.batch);
      profile.backend = std::string(backend.name());
      profile.ranks = backend.world_size();
      profile.workers = steps[k]->executor().workers();
      // A planned order runs one collective at a time (TrainStep::schedule_from_last_run).
      const std::size_t in_flight = configs[k].executor.collectives_in_flight;
      profile.collectives_in_flight =
          steps[k]->plan() ? steps[k]->plan()->plan.collectives_in_flight
          : in_flight == 0 && !steps[k]->issue_order().empty() ? 1
                                                               : in_flight;
      profile.measured_step_s = r.step_ms * 1e-3;
      profile.measured_comm_s = r.comm_ms * 1e-3;
      profile.measured_compute_s = r.compute_ms * 1e-3;
      save_step_profile(profile, plan.profile_prefix + "." + r.label + ".json");
    }
  }
  return results;
}

}  // namespace loom::bench
