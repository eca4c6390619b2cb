// loom-overlap: runs the MLP train step in sequential, ddp and loom modes in one process (steps
// interleaved round-robin) and reports step time, compute, communication and how much of the
// communication compute hid (medians).
//   loom-overlap --ranks 2 --depth 8 --width 512 --json overlap.json
//   bench/netem.sh 2gbit -- mpirun -np 2 build/bin/loom-overlap --trace t.json --dot step.dot
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>

#include <oneapi/tbb/global_control.h>
#include <boost/program_options.hpp>

#include "loom/error.hpp"
#include "loom/local.hpp"
#include "loom/output_file.hpp"
#include "overlap_benchmark.hpp"
#include "train_options.hpp"

namespace po = boost::program_options;
using namespace loom;
using loom::examples::OverlapMode;

namespace {

struct Flags {
  examples::TrainFlags train;
  int ranks = 2;
  int threads = 0;
  bench::RunPlan plan;
  bool schedule = false;
  bool auto_plan = false;
  bool sweep = false;
  std::string json;
};

// --sweep: loom mode at every cap x collectives in flight, beside the automatic plan.
constexpr std::size_t sweep_caps_kb[] = {256, 512, 1024, 2048, 4096, 8192, 25600};
constexpr std::size_t sweep_in_flight[] = {0, 1, 2};

std::string in_flight_text(std::size_t n) {
  return n == 0 ? "unlimited" : std::to_string(n);
}

constexpr OverlapMode modes[] = {OverlapMode::sequential, OverlapMode::ddp, OverlapMode::loom};

std::vector<bench::ModeResult> run_all(Backend& backend, const Flags& flags) {
  std::vector<examples::TrainConfig> configs;
  bench::RunPlan plan = flags.plan;
  if (flags.sweep) {
    for (std::size_t cap : sweep_caps_kb)
      for (std::size_t in_flight : sweep_in_flight) {
        configs.push_back(flags.train.config);
        configs.back().mode = OverlapMode::loom;
        configs.back().bucketing.bucket_cap_bytes = cap << 10;
        configs.back().bucketing.first_bucket_bytes = std::min(cap, flags.train.first_bucket_kb)
                                                      << 10;
        configs.back().executor.collectives_in_flight = in_flight;
        plan.labels.push_back("cap" + std::to_string(cap) + "k/" + in_flight_text(in_flight));
      }
  } else {
    for (OverlapMode mode : modes) {
      configs.push_back(flags.train.config);
      configs.back().mode = mode;
      plan.labels.emplace_back(examples::to_string(mode));
    }
  }
  if (flags.auto_plan || flags.sweep) {
    configs.push_back(flags.train.config);
    configs.back().mode = OverlapMode::loom;
    configs.back().automatic_plan = examples::PlanSearch{};
    plan.labels.emplace_back("loom-auto");
  }
  plan.files_from = flags.sweep ? configs.size() - 1 : 2;  // loom (manual)
  auto results = bench::run_modes(backend, configs, plan);
  for (auto& r : results) r.speedup_vs_sequential = results[0].step_ms / r.step_ms;
  return results;
}

void report(const std::vector<bench::ModeResult>& results, const Flags& flags,
            std::string_view backend) {
  const auto& shape = flags.train.config.shape;
  // The configured buckets are the first row's (sequential); --sweep's rows name their own.
  char buckets[128];
  if (flags.sweep)
    std::snprintf(buckets, sizeof buckets, "buckets per row");
  else
    std::snprintf(buckets, sizeof buckets, "%zu bucket%s (cap %zu KiB, first %zu KiB%s)",
                  results.front().buckets, results.front().buckets == 1 ? "" : "s",
                  flags.train.bucket_cap_kb, flags.train.first_bucket_kb,
                  flags.train.config.bucketing.partition_large ? ", partition-large" : "");
  const std::string block =
      flags.plan.block_steps == 1
          ? std::string("steps (a barrier before each)")
          : "blocks of " + std::to_string(flags.plan.block_steps) + " steps back to back";
  std::printf(
      "# loom-overlap: %d ranks (%.*s), MLP %d -> %d x %d -> %d, batch %d per rank, "
      "registration %s, %s, %d %s after %d warm-ups, modes interleaved, medians\n",
      results[0].ranks, static_cast<int>(backend.size()), backend.data(), shape.input, shape.depth,
      shape.width, shape.output, shape.batch, flags.train.registration.c_str(), buckets,
      flags.plan.steps, block.c_str(), flags.plan.warmups);
  // Whether communication progresses beside compute depends on it (LOOM_PROGRESS_PRIORITY).
  std::printf("# progress thread (rank 0, %s mode): %s\n", results.back().label.c_str(),
              results.back().progress_priority.c_str());
  std::printf("# %-19s %9s %10s %9s %9s %10s %8s %8s %13s %11s\n", "mode", "step_ms", "compute_ms",
              "comm_ms", "hidden_ms", "exposed_ms", "overlap", "speedup", "step/max(c,m)",
              "cpu_ms/step");
  for (const auto& r : results)
    std::printf("  %-19s %9.3f %10.3f %9.3f %9.3f %10.3f %8.3f %8.3f %13.3f %11.3f\n",
                r.label.c_str(), r.step_ms, r.compute_ms, r.comm_ms, r.hidden_ms, r.exposed_comm_ms,
                r.overlap_efficiency, r.speedup_vs_sequential,
                r.step_ms / std::max(r.compute_ms, r.comm_ms), r.cpu_ms);
  for (const auto& r : results) {
    if (r.plan.empty()) continue;
    std::printf("# %s runs %s; it timed (predicted -> measured, warm-up runs):\n", r.label.c_str(),
                r.plan.c_str());
    for (const auto& p : r.plans_tried)
      std::printf("#   %-58s %9.3f -> %9.3f ms\n", examples::describe(p).c_str(),
                  p.predicted_step_s * 1e3, p.measured_step_s * 1e3);
  }
  if (flags.sweep) {
    // The automatic plan (last) against the best and the worst manual configuration.
    const auto best = std::min_element(results.begin(), results.end() - 1,
                                       [](auto& a, auto& b) { return a.step_ms < b.step_ms; });
    const auto worst = std::max_element(results.begin(), results.end() - 1,
                                        [](auto& a, auto& b) { return a.step_ms < b.step_ms; });
    std::printf(
        "# sweep: best manual %s %.3f ms, worst %s %.3f ms; loom-auto %.3f ms = %.3f x "
        "best manual\n",
        best->label.c_str(), best->step_ms, worst->label.c_str(), worst->step_ms,
        results.back().step_ms, results.back().step_ms / best->step_ms);
  }
  for (const auto& r : results)
    if (r.label == "loom" && !r.communication.empty()) {
      std::printf("# loom mode's last step on rank 0: why each collective was or wasn't hidden\n");
      std::ostringstream report;
      print_communication_report(report, r.communication);
      std::fputs(report.str().c_str(), stdout);
    }
  if (!flags.plan.trace_path.empty())
    std::printf("# loom mode's last step: trace %s (ui.perfetto.dev)\n",
                flags.plan.trace_path.c_str());
  if (!flags.plan.dot_path.empty())
    std::printf("# loom mode's graph: %s (dot -Tsvg %s -o step.svg)\n", flags.plan.dot_path.c_str(),
                flags.plan.dot_path.c_str());
}

void write_json(const std::vector<bench::ModeResult>& results, const std::string& path) {
  std::ofstream out = open_output_file(path, "JSON file");
  out << "[\n";
  for (std::size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    char line[640];
    std::snprintf(line, sizeof line,
                  "  {\"mode\": \"%s\", \"ranks\": %d, \"buckets\": %zu, \"step_ms\": %.6f, "
                  "\"cpu_ms\": %.6f, "
                  "\"compute_ms\": %.6f, \"comm_ms\": %.6f, \"hidden_ms\": %.6f, "
                  "\"exposed_comm_ms\": %.6f, \"overlap_efficiency\": %.6f, "
                  "\"speedup_vs_sequential\": %.6f}%s\n",
                  r.label.c_str(), r.ranks, r.buckets, r.step_ms, r.cpu_ms, r.compute_ms, r.comm_ms,
                  r.hidden_ms, r.exposed_comm_ms, r.overlap_efficiency, r.speedup_vs_sequential,
                  i + 1 < results.size() ? "," : "");
    out << line;
  }
  out << "]\n";
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  po::options_description options("loom-overlap options");
  options.add_options()("help,h", "this help")("ranks",
                                               po::value(&flags.ranks)->default_value(flags.ranks),
                                               "local ranks (threads) when not under mpirun")(
      "steps", po::value(&flags.plan.steps)->default_value(flags.plan.steps),
      "measured steps per mode (samples, with --block)")(
      "block", po::value(&flags.plan.block_steps)->default_value(flags.plan.block_steps),
      "steps per sample, run back to back after one barrier (1: a barrier before every "
      "step; training has none)")("warmups",
                                  po::value(&flags.plan.warmups)->default_value(flags.plan.warmups),
                                  "unmeasured steps per mode first")(
      "threads", po::value(&flags.threads)->default_value(flags.threads),
      "TBB worker threads per process (0: TBB's default)")(
      "schedule", po::bool_switch(&flags.schedule),
      "loom mode plans its issue order from the warm-ups, one collective on the wire at a "
      "time (TrainStep::schedule_from_last_run; needs --warmups >= 2)")(
      "auto-plan", po::bool_switch(&flags.auto_plan),
      "add loom-auto: loom mode planning its buckets, issue order and collectives in flight "
      "from its warm-ups: predicted by the step simulator, the shortlist timed "
      "(TrainConfig::automatic_plan; needs --warmups >= 19)")(
      "sweep", po::bool_switch(&flags.sweep),
      "loom mode at every bucket cap 256 KiB..25 MiB x collectives in flight unlimited/1/2, "
      "and loom-auto, interleaved, in place of the three modes")(
      "rebuild", po::bool_switch(&flags.plan.rebuild),
      "rebuild buckets from rank 0's ready order after the first warm-up (DDP's rebuild)")(
      "json", po::value(&flags.json), "write one JSON object per mode to this file")(
      "trace", po::value(&flags.plan.trace_path), "Chrome trace of loom mode's last step")(
      "dot", po::value(&flags.plan.dot_path), "DOT graph of loom mode's step")(
      "profile-json", po::value(&flags.plan.profile_prefix),
      "write each mode's step profile (graph and node durations over the last 64 measured steps, "
      "for loom-predict) to PREFIX.<mode>.json");
  examples::add_train_options(options, flags.train);
  try {
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, options), vm);
    if (vm.count("help")) {
      std::cout << options << "\n";
      return 0;
    }
    po::notify(vm);
    examples::apply_train_options(flags.train);
    if (flags.plan.steps < 1 || flags.plan.block_steps < 1 || flags.plan.warmups < 0 ||
        flags.ranks < 1 || flags.threads < 0)
      throw Error(ErrorCode::invalid_argument,
                  "--steps, --block and --ranks must be >= 1, --warmups and --threads >= 0");
    if (flags.plan.rebuild && flags.plan.warmups < 1)
      throw Error(ErrorCode::invalid_argument, "--rebuild needs at least one warm-up step");
    // The plan comes from the warm-ups and is run once before the timed steps.
    if (flags.schedule && flags.plan.warmups < 2)
      throw Error(ErrorCode::invalid_argument, "--schedule needs at least two warm-up steps");
    flags.plan.schedule = flags.schedule;
    // loom-auto decides within its warm-ups, and the last warm-up runs its final plan.
    const int decide = examples::PlanSearch{}.runs_to_decide();
    if ((flags.auto_plan || flags.sweep) && flags.plan.warmups < decide + 1)
      throw Error(ErrorCode::invalid_argument,
                  "--auto-plan and --sweep need at least " + std::to_string(decide + 1) +
                      " warm-up steps (the automatic plan profiles, times its shortlist and "
                      "then runs the fastest)");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom-overlap: %s\n", e.what());
    return 2;
  }
  std::optional<tbb::global_control> threads;
  if (flags.threads > 0)
    threads.emplace(tbb::global_control::max_allowed_parallelism, flags.threads);
  try {
    std::vector<bench::ModeResult> results;
    std::string backend_name;
    if (launched_by_mpirun()) {
      auto backend = create_backend();
      results = run_all(*backend, flags);
      if (backend->rank() != 0) return 0;
      backend_name = backend->name();
    } else {
      std::mutex mutex;
      LocalWorld::run(flags.ranks, [&](Backend& backend) {
        auto mine = run_all(backend, flags);
        std::lock_guard lock(mutex);
        if (backend.rank() == 0) {
          results = std::move(mine);
          backend_name = backend.name();
        }
      });
    }
    report(results, flags, backend_name);
    if (!flags.json.empty()) write_json(results, flags.json);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "loom-overlap: %s\n", e.what());
    return 1;
  }
}
