// PinnedPool micro-benchmarks: the cost of a hit, and system allocations saved in a steady
// state of bucket-sized requests, each against the no-pool baseline in the same binary.
#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <cstdlib>
#include <loom/pinned_pool.hpp>

namespace {

// A hit: acquire a block of a class that is on the free list, release it again.
void BM_PoolHit(benchmark::State& state) {
  loom::PinnedPool pool;
  pool.acquire(static_cast<std::size_t>(state.range(0))).release();  // warm the class
  for (auto _ : state) {
    loom::PinnedBlock block = pool.acquire(static_cast<std::size_t>(state.range(0)));
    benchmark::DoNotOptimize(block.data());
  }
  state.counters["hit_rate"] = pool.stats().hit_rate();
}
BENCHMARK(BM_PoolHit)->Arg(4096)->Arg(1 << 20)->Arg(25 << 20);

// Baseline: what the pool replaces, an aligned allocation locked and freed each time.
void BM_NoPoolLockedAlloc(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* p = std::aligned_alloc(4096, loom::PinnedPool::size_class(bytes));
    const bool locked = ::mlock(p, bytes) == 0;
    benchmark::DoNotOptimize(p);
    if (locked) ::munlock(p, bytes);
    std::free(p);
  }
}
BENCHMARK(BM_NoPoolLockedAlloc)->Arg(4096)->Arg(1 << 20)->Arg(25 << 20);

// Steady state of a training loop: every step asks for the same set of bucket buffers
// (a 1 MiB first bucket, then 25 MiB buckets and a ragged last one) and releases them.
// Reports system allocations per step with the pool; without it every request is one.
void BM_BucketSteadyState(benchmark::State& state) {
  const std::size_t sizes[] = {1 << 20, 25 << 20, 25 << 20, 25 << 20, 7 << 20};
  loom::PinnedPool pool;
  std::int64_t steps = 0;
  for (auto _ : state) {
    std::vector<loom::PinnedBlock> step;
    for (std::size_t s : sizes) step.push_back(pool.acquire(s));
    benchmark::DoNotOptimize(step.data());
    ++steps;
  }
  const auto stats = pool.stats();
  const double requests = static_cast<double>(steps) * std::size(sizes);
  state.counters["system_allocs_per_request"] =
      static_cast<double>(stats.system_allocations) / requests;
  state.counters["no_pool_allocs_per_request"] = 1.0;
  state.counters["fewer_allocations_pct"] =
      100.0 * (1.0 - static_cast<double>(stats.system_allocations) / requests);
  state.counters["hit_rate"] = stats.hit_rate();
}
BENCHMARK(BM_BucketSteadyState)->Iterations(200);

}  // namespace

BENCHMARK_MAIN();
