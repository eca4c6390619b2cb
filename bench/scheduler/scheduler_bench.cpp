// loom-bench-scheduler: per-node overhead of loom's executor against a raw tbb::flow::graph of
// continue_nodes on the same shapes (chain, fan-out/fan-in, wavefront, random DAG), and the
// time and memory of compiling a 100k-node graph.
#include <benchmark/benchmark.h>

#include <malloc.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <oneapi/tbb/flow_graph.h>

#include "loom/executor.hpp"
#include "loom/graph.hpp"
#include "loom/local.hpp"

namespace {

struct Shape {
  std::size_t nodes = 0;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> edges;
  int priority = 0;  ///< of every node, in loom and in raw oneTBB alike
};

Shape chain(std::size_t n) {
  Shape s{n, {}};
  for (std::uint32_t i = 1; i < n; ++i) s.edges.emplace_back(i - 1, i);
  return s;
}

// The chain with every node at priority 1: loom gives each node its own TBB node (a chain of
// priority-0 nodes runs as one, wiring.cpp), so this is what each node costs against TBB's.
Shape chain_prioritised(std::size_t n) {
  Shape s = chain(n);
  s.priority = 1;
  return s;
}

// One source, n - 2 independent middles, one sink.
Shape fan(std::size_t n) {
  Shape s{n, {}};
  const auto sink = static_cast<std::uint32_t>(n - 1);
  for (std::uint32_t i = 1; i < sink; ++i) {
    s.edges.emplace_back(0, i);
    s.edges.emplace_back(i, sink);
  }
  return s;
}

// A side x side lattice: (i, j) precedes (i + 1, j) and (i, j + 1).
Shape wavefront(std::size_t n) {
  const auto side = static_cast<std::uint32_t>(std::lround(std::sqrt(static_cast<double>(n))));
  Shape s{std::size_t{side} * side, {}};
  for (std::uint32_t i = 0; i < side; ++i)
    for (std::uint32_t j = 0; j < side; ++j) {
      const std::uint32_t v = i * side + j;
      if (i + 1 < side) s.edges.emplace_back(v, v + side);
      if (j + 1 < side) s.edges.emplace_back(v, v + 1);
    }
  return s;
}

// Each node takes up to 3 distinct predecessors among the 64 before it (fixed seed).
Shape random_dag(std::size_t n) {
  Shape s{n, {}};
  std::mt19937 random(42);
  for (std::uint32_t v = 1; v < n; ++v) {
    const std::uint32_t window = std::min<std::uint32_t>(v, 64);
    const std::uint32_t k = 1 + random() % std::min<std::uint32_t>(window, 3);
    std::vector<std::uint32_t> picked;
    while (picked.size() < k) {
      const std::uint32_t u = v - 1 - random() % window;
      if (std::find(picked.begin(), picked.end(), u) == picked.end()) picked.push_back(u);
    }
    for (std::uint32_t u : picked) s.edges.emplace_back(u, v);
  }
  return s;
}

using Builder = Shape (*)(std::size_t);
const std::vector<std::pair<std::string, Builder>> shapes = {
    {"chain", chain},
    {"chain_prioritised", chain_prioritised},
    {"fanout_fanin", fan},
    {"wavefront", wavefront},
    {"random_dag", random_dag}};
const std::vector<std::size_t> sizes = {1000, 10000, 100000};

loom::Graph loom_graph(const Shape& shape) {
  loom::Graph g;
  std::vector<loom::Task> tasks;
  tasks.reserve(shape.nodes);
  loom::ComputeOptions options;
  options.priority = shape.priority;
  for (std::size_t i = 0; i < shape.nodes; ++i)
    tasks.push_back(g.compute(
        "n" + std::to_string(i), [] {}, options));
  for (const auto& [from, to] : shape.edges) g.add_edge(tasks[from], tasks[to]);
  return g;
}

void set_per_node(benchmark::State& state, const Shape& shape, double total_ns) {
  state.counters["ns_per_node"] =
      total_ns / (static_cast<double>(state.iterations()) * static_cast<double>(shape.nodes));
  state.counters["nodes"] = static_cast<double>(shape.nodes);
  state.counters["edges"] = static_cast<double>(shape.edges.size());
}

void bm_loom(benchmark::State& state, Builder build, std::size_t n) {
  const Shape shape = build(n);
  auto backend = loom::make_local_backend();
  loom::Executor executor(loom_graph(shape), *backend);
  double total_ns = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    executor.run();
    total_ns +=
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  }
  set_per_node(state, shape, total_ns);
}

void bm_raw_tbb(benchmark::State& state, Builder build, std::size_t n) {
  namespace flow = tbb::flow;
  const Shape shape = build(n);
  flow::graph g;
  flow::broadcast_node<flow::continue_msg> start(g);
  std::vector<std::unique_ptr<flow::continue_node<flow::continue_msg>>> nodes;
  nodes.reserve(shape.nodes);
  for (std::size_t i = 0; i < shape.nodes; ++i)
    nodes.push_back(std::make_unique<flow::continue_node<flow::continue_msg>>(
        g, [](const flow::continue_msg&) { return flow::continue_msg(); },
        static_cast<flow::node_priority_t>(shape.priority)));
  std::vector<char> has_predecessor(shape.nodes, 0);
  for (const auto& [from, to] : shape.edges) {
    flow::make_edge(*nodes[from], *nodes[to]);
    has_predecessor[to] = 1;
  }
  for (std::size_t i = 0; i < shape.nodes; ++i)
    if (!has_predecessor[i]) flow::make_edge(start, *nodes[i]);
  double total_ns = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    start.try_put(flow::continue_msg());
    g.wait_for_all();
    total_ns +=
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  }
  set_per_node(state, shape, total_ns);
}

long rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  long pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * 4096;
}

// Compile time of a 100k-node random DAG (graph built outside the timing) and the memory the
// compiled executor holds per node: heap bytes in use (exact) and resident set growth.
void bm_compile(benchmark::State& state, Builder build, std::size_t n) {
  const Shape shape = build(n);
  auto backend = loom::make_local_backend();
  double heap_per_node = 0, rss_per_node = 0, graph_heap_per_node = 0;
  for (auto _ : state) {
    state.PauseTiming();
    malloc_trim(0);
    const auto heap0 = mallinfo2().uordblks;
    const long rss0 = rss_bytes();
    auto graph = std::make_unique<loom::Graph>(loom_graph(shape));
    const auto heap1 = mallinfo2().uordblks;
    state.ResumeTiming();
    auto executor = std::make_unique<loom::Executor>(*graph, *backend);
    state.PauseTiming();
    const auto heap2 = mallinfo2().uordblks;
    const long rss2 = rss_bytes();
    graph_heap_per_node = static_cast<double>(heap1 - heap0) / shape.nodes;
    heap_per_node = static_cast<double>(heap2 - heap1) / shape.nodes;
    rss_per_node = static_cast<double>(rss2 - rss0) / shape.nodes;
    executor.reset();
    graph.reset();
    state.ResumeTiming();
  }
  state.counters["graph_heap_B_per_node"] = graph_heap_per_node;
  state.counters["executor_heap_B_per_node"] = heap_per_node;
  state.counters["rss_B_per_node"] = rss_per_node;
  state.counters["nodes"] = static_cast<double>(shape.nodes);
}

}  // namespace

int main(int argc, char** argv) {
  for (const auto& [name, build] : shapes)
    for (std::size_t n : sizes) {
      const std::string suffix = "/" + name + "/" + std::to_string(n);
      benchmark::RegisterBenchmark(("BM_Loom" + suffix).c_str(), bm_loom, build, n)
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("BM_RawTbb" + suffix).c_str(), bm_raw_tbb, build, n)
          ->Unit(benchmark::kMicrosecond);
    }
  for (const auto& [name, build] : shapes)
    if (name != "chain_prioritised")
      benchmark::RegisterBenchmark(("BM_Compile/" + name + "/100000").c_str(), bm_compile, build,
                                   std::size_t{100000})
          ->Unit(benchmark::kMillisecond)
          ->Iterations(3);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
