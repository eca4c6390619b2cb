// Soak on the local backend: 3 ranks (threads), the training-step graph for many steps; memory,
// pinned pool and file descriptors flat after warm-up. Long form: LOOM_SOAK_ITERATIONS=10000.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <cstdio>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "loom/executor.hpp"
#include "loom/local.hpp"
#include "scoped_env.hpp"
#include "soak/soak.hpp"

namespace loom {
namespace {

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
  std::mutex mutex;
  std::vector<std::string> failures;
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
    if (!failure.empty()) {
      std::lock_guard lock(mutex);
      failures.push_back("rank " + std::to_string(backend.rank()) + ":" + failure);
    }
  });
  tracing.reset();
  EXPECT_TRUE(failures.empty()) << failures.front();
  for (int r = 0; r < 2; ++r)
    std::remove(
        (testing::TempDir() + "soak_profiled_trace.rank" + std::to_string(r) + ".json").c_str());
}

}  // namespace
}  // namespace loom
