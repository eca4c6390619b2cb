// Soak on the local backend: 3 ranks (threads), the training-step graph and a sharded reducer
// for many steps; memory, pinned pool and file descriptors flat after warm-up. Long form:
// LOOM_SOAK_ITERATIONS=10000.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "loom/executor.hpp"
#include "loom/gradient_reducer.hpp"
#include "loom/local.hpp"
#include "scoped_env.hpp"
#include "soak/soak.hpp"

namespace loom {
namespace {

// What each rank found wrong, gathered across the rank threads.
class RankFailures {
 public:
  void add(int rank, const std::string& failure) {
    if (failure.empty()) return;
    std::lock_guard lock(_mutex);
    _failures.push_back("rank " + std::to_string(rank) + ":" + failure);
  }
  bool empty() const { return _failures.empty(); }
  const std::string& first() const { return _failures.front(); }

 private:
  std::mutex _mutex;
  std::vector<std::string> _failures;
};

// Removes the per-rank traces that LOOM_TRACE=<TempDir>/<stem>.json wrote.
void remove_traces(const std::string& stem, int ranks) {
  for (int r = 0; r < ranks; ++r)
    std::remove((testing::TempDir() + stem + ".rank" + std::to_string(r) + ".json").c_str());
}

TEST(Soak, LocalBackendThreeRanksStaysFlat) {
  const long iterations = test::soak_iterations(300);
  LocalWorld::run(3, [&](Backend& backend) { test::soak(backend, iterations); });
}

// Profiling on (LOOM_TRACE set: a trace written after every run, the profiler recording every
// communication node): 40,000 runs of a small graph on two ranks keep resident memory flat,
// and the profiler keeps its aggregates over every run but only a bounded window of records
// (issue 12: it used to keep one record per node per run, 1.3 KB per step without bound). Each
// run's sum is checked in the graph: rank r contributes r + 1 + run, so only a reduction over
// both ranks of this very run gives 2 * run + 3.
TEST(Soak, ProfiledRunsWithTraceKeepMemoryFlat) {
  const long runs = test::sanitized_build ? 20000 : 40000;
  const long warmup = runs / 10;
  const std::string trace = testing::TempDir() + "soak_profiled_trace.json";
  std::optional<test::ScopedEnv> tracing(std::in_place, "LOOM_TRACE", trace.c_str());
  RankFailures failures;
  LocalWorld::run(2, [&](Backend& backend) {
    std::vector<float> grad(256, 0.0f);
    long run = 0, right = 0;
    Graph g;
    auto produce =
        g.compute("produce", [&] { grad[0] = static_cast<float>(backend.rank() + 1 + run); });
    auto reduce = g.allreduce("grad.allreduce", Buffer::of(std::span(grad)));
    auto consume = g.compute("consume", [&] {
      if (grad[0] == static_cast<float>(2 * run + 3)) ++right;
      ++run;
    });
    produce.precede(reduce);
    reduce.precede(consume);
    Executor ex(g, backend);
    ex.run(static_cast<std::size_t>(warmup));
    const auto warm = test::sample_process();
    ex.run(static_cast<std::size_t>(runs - warmup));
    const auto end = test::sample_process();
    const double growth_mib =
        (static_cast<double>(end.rss_bytes) - static_cast<double>(warm.rss_bytes)) / (1 << 20);
    std::printf(
        "profiled runs on rank %d: %ld (%ld summed right), resident %.1f -> %.1f MiB (%+.2f MiB), "
        "profiler keeps %zu of %zu records\n",
        backend.rank(), runs, right, static_cast<double>(warm.rss_bytes) / (1 << 20),
        static_cast<double>(end.rss_bytes) / (1 << 20), growth_mib, ex.profiler().records().size(),
        ex.profiler().total_recorded());
    std::string failure;
    if (right != runs) failure += " " + std::to_string(runs - right) + " runs summed wrong";
    if (ex.profiler().total_recorded() != static_cast<std::size_t>(runs))
      failure += " profiler recorded " + std::to_string(ex.profiler().total_recorded());
    if (ex.profiler().records().size() != CommunicationProfiler::default_window)
      failure += " profiler keeps " + std::to_string(ex.profiler().records().size());
    if (ex.profiler().stats().size() != 1 || ex.profiler().stats()[0].count != std::size_t(runs))
      failure += " profiler's aggregate is wrong";
    if (test::rss_is_meaningful && growth_mib >= 2.0)  // was ~1.3 KB per run: 46 MiB
      failure += " resident memory grew " + std::to_string(growth_mib) + " MiB";
    failures.add(backend.rank(), failure);
  });
  tracing.reset();
  EXPECT_TRUE(failures.empty()) << failures.first();
  remove_traces("soak_profiled_trace", 2);
}

// A sharded plan (ShardLevel::gradients: exact page mappings, each bucket's pages given back
// after its scatter and faulted in again by the next step, a reduce-scatter that uses its input
// as workspace, the all-gathers into the parameter memory) with every recording option on
// (LOOM_TRACE: a trace after every run, the profiler): 3 ranks, odd sizes; resident memory flat
// after warm-up, the profiler's window bounded, and every step's values right. Rank r hands over
// gradients r + 1 + step (averaged: 2 + step); each rank writes the average into its pieces,
// so after the gathers every parameter element must read 2 + step (to rounding).
TEST(Soak, ShardedReducerWithTraceKeepsMemoryFlat) {
  const long steps = test::soak_iterations(test::sanitized_build ? 1000 : 600);
  const long warmup = std::min<long>(100, steps / 2);
  const std::string trace = testing::TempDir() + "soak_sharded_trace.json";
  std::optional<test::ScopedEnv> tracing(std::in_place, "LOOM_TRACE", trace.c_str());
  const std::vector<ParameterSpec> parameters{{"embed.weight", "embed", 30011},
                                              {"layers.0.weight", "layers.0", 65537},
                                              {"layers.0.bias", "layers.0", 257},
                                              {"head.weight", "head", 100003}};
  ReducerPlan plan;
  plan.shard = ShardLevel::gradients;
  plan.bucket_cap_bytes = std::size_t{256} << 10;
  plan.first_bucket_bytes = std::size_t{64} << 10;
  plan.partition_large = true;
  RankFailures failures;
  LocalWorld::run(3, [&](Backend& backend) {
    ExecutorOptions options;
    options.timeout = std::chrono::duration<double>(120);
    GradientReducer reducer(parameters, backend, plan, options);
    const std::size_t n = reducer.num_parameters();
    std::vector<std::vector<float>> grads(n);
    for (std::size_t p = 0; p < n; ++p) grads[p].resize(reducer.parameter(p).count);
    long wrong = 0;
    test::ProcessSample warm;
    for (long step = 0; step < steps; ++step) {
      if (step == warmup) warm = test::sample_process();
      reducer.begin();
      for (std::size_t p = 0; p < n; ++p) {
        std::fill(grads[p].begin(), grads[p].end(), float(backend.rank() + 1 + step % 1000));
        reducer.ready(p, Buffer::of(std::span(grads[p])));
      }
      for (std::size_t k = 0; k < reducer.num_update_groups(); ++k) {
        reducer.wait_update(k);
        for (const ShardPiece& piece : reducer.shard_pieces(k))
          std::copy_n(piece.gradient.as<float>(), piece.count, piece.values.as<float>());
        reducer.updated(k);
      }
      for (std::size_t k = 0; k < reducer.num_update_groups(); ++k) reducer.wait_gathered(k);
      reducer.finish();
      const float want = float(2 + step % 1000);
      for (std::size_t p = 0; p < n; ++p) {
        const float* v = reducer.parameter_values(p).as<float>();
        // Each share is scaled by 1/3 before the sum: within rounding of the average.
        wrong += std::count_if(v, v + reducer.parameter(p).count,
                               [&](float x) { return std::fabs(x - want) > 1e-5f * want; });
      }
    }
    const auto end = test::sample_process();
    const double growth_mib =
        (static_cast<double>(end.rss_bytes) - static_cast<double>(warm.rss_bytes)) / (1 << 20);
    const CommunicationProfiler& profiler = reducer.executor().profiler();
    std::printf(
        "sharded soak rank %d: %ld steps (%ld warm-up), %ld wrong values; resident %.1f -> "
        "%.1f MiB (%+.2f MiB); profiler keeps %zu of %zu records; fds %zu -> %zu\n",
        backend.rank(), steps, warmup, wrong, static_cast<double>(warm.rss_bytes) / (1 << 20),
        static_cast<double>(end.rss_bytes) / (1 << 20), growth_mib, profiler.records().size(),
        profiler.total_recorded(), warm.open_fds, end.open_fds);
    std::string failure;
    if (wrong != 0) failure += " " + std::to_string(wrong) + " parameter values wrong";
    if (profiler.records().size() > CommunicationProfiler::default_window)
      failure += " profiler keeps " + std::to_string(profiler.records().size());
    if (end.open_fds > warm.open_fds)
      failure += " new descriptors: " + test::new_descriptors(warm, end);
    if (test::rss_is_meaningful && growth_mib * (1 << 20) > double(test::rss_growth_bound))
      failure += " resident memory grew " + std::to_string(growth_mib) + " MiB";
    failures.add(backend.rank(), failure);
  });
  tracing.reset();
  EXPECT_TRUE(failures.empty()) << failures.first();
  remove_traces("soak_sharded_trace", 3);
}

}  // namespace
}  // namespace loom
