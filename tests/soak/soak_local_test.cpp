// Soak on the local backend: 3 ranks (threads), the training-step graph for many steps; memory,
// pinned pool and file descriptors flat after warm-up. Long form: LOOM_SOAK_ITERATIONS=10000.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "loom/executor.hpp"
#include "loom/local.hpp"
#include "soak/soak.hpp"

namespace loom {
namespace {

TEST(Soak, LocalBackendThreeRanksStaysFlat) {
  const long iterations = test::soak_iterations(300);
  LocalWorld::run(3, [&](Backend& backend) { test::soak(backend, iterations); });
}

// Profiling on (LOOM_TRACE set: a trace written after every run, the profiler recording every
// communication node): 100,000 runs of a small graph keep resident memory flat, and the
// profiler keeps its aggregates over every run but only a bounded window of records (issue 12:
// it used to keep one record per node per run, 1.3 KB per step without bound).
TEST(Soak, ProfiledRunsWithTraceKeepMemoryFlat) {
  const long runs = test::sanitized_build ? 20000 : 100000;
  const std::string trace = testing::TempDir() + "soak_profiled_trace.json";
  ::setenv("LOOM_TRACE", trace.c_str(), 1);
  auto backend = make_local_backend();
  std::vector<float> grad(256, 1.0f);
  Graph g;
  auto produce = g.compute("produce", [&] { grad[0] = 1.0f; });
  auto reduce = g.allreduce("grad.allreduce", Buffer::of(std::span(grad)));
  auto consume = g.compute("consume", [&] {
    if (grad[0] != 1.0f) ADD_FAILURE() << "wrong sum";
  });
  produce.precede(reduce);
  reduce.precede(consume);
  Executor ex(g, *backend);
  ::unsetenv("LOOM_TRACE");
  const long warmup = runs / 10;
  ex.run(static_cast<std::size_t>(warmup));
  const auto warm = test::sample_process();
  ex.run(static_cast<std::size_t>(runs - warmup));
  const auto end = test::sample_process();
  const double growth_mib =
      (static_cast<double>(end.rss_bytes) - static_cast<double>(warm.rss_bytes)) / (1 << 20);
  std::printf(
      "profiled runs: %ld, resident %.1f -> %.1f MiB (%+.2f MiB), profiler keeps %zu of "
      "%zu records\n",
      runs, static_cast<double>(warm.rss_bytes) / (1 << 20),
      static_cast<double>(end.rss_bytes) / (1 << 20), growth_mib, ex.profiler().records().size(),
      ex.profiler().total_recorded());
  EXPECT_EQ(ex.profiler().total_recorded(), static_cast<std::size_t>(runs));
  EXPECT_EQ(ex.profiler().records().size(), CommunicationProfiler::default_window);
  ASSERT_EQ(ex.profiler().stats().size(), 1u);
  EXPECT_EQ(ex.profiler().stats()[0].count, static_cast<std::size_t>(runs));
  if (test::rss_is_meaningful) EXPECT_LT(growth_mib, 2.0);  // was ~1.3 KB per run: 117 MiB
  std::remove(trace.c_str());
}

}  // namespace
}  // namespace loom
