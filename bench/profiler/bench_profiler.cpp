// CommunicationProfiler cost: a record() while off and on, and a whole executor step with
// profiling off and on, each against its baseline in the same binary.
#include <benchmark/benchmark.h>

#include <loom/communication_profiler.hpp>
#include <loom/executor.hpp>
#include <loom/local.hpp>
#include <vector>

namespace {

// The call sites' pattern: test enabled() before building a record.
void BM_RecordWhileOff(benchmark::State& state) {
  loom::CommunicationProfiler profiler(false);
  for (auto _ : state) {
    if (profiler.enabled())
      profiler.record(
          {"node", "allreduce", 4096, 4, "ring", 0, loom::CommunicationProfiler::now_ns()});
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_RecordWhileOff);

void BM_RecordWhileOn(benchmark::State& state) {
  loom::CommunicationProfiler profiler(true);
  std::size_t kept = 0;
  for (auto _ : state) {
    if (profiler.enabled())
      profiler.record(
          {"node", "allreduce", 4096, 4, "ring", 0, loom::CommunicationProfiler::now_ns()});
    if (++kept == 100000) profiler.clear(), kept = 0;  // bounded memory, rarely taken
  }
}
BENCHMARK(BM_RecordWhileOn);

// One executor step: compute -> allreduce (1 rank, 1 KiB) -> compute; range(0) = profile.
void BM_ExecutorStep(benchmark::State& state) {
  auto backend = loom::make_local_backend();
  std::vector<float> grad(256, 1.0f);
  loom::Graph g;
  auto produce = g.compute("produce", [&] { grad[0] += 1; });
  auto reduce = g.allreduce("reduce", loom::Buffer::of(std::span(grad)));
  auto consume = g.compute("consume", [&] { benchmark::DoNotOptimize(grad[0]); });
  produce.precede(reduce);
  reduce.precede(consume);
  loom::ExecutorOptions options;
  options.profile = state.range(0) != 0;
  loom::Executor ex(g, *backend, options);
  for (auto _ : state) ex.run();
  state.SetLabel(state.range(0) != 0 ? "profile on" : "profile off");
}
BENCHMARK(BM_ExecutorStep)->Arg(0)->Arg(1)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
