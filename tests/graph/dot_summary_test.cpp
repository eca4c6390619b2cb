// Tests the summary DOT (graph/src/dot_summary.cpp): clusters per group, compute runs collapsed,
// edges bundled with counts, communication kept, no cycle among the boxes, the automatic switch,
// and that Graphviz accepts the result.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "loom/executor.hpp"
#include "loom/graph.hpp"
#include "loom/local.hpp"

namespace loom {
namespace {

struct Parsed {
  std::map<std::string, std::string> label_of;                       // box id -> label
  std::vector<std::string> clusters;                                 // cluster labels
  std::map<std::pair<std::string, std::string>, std::string> edges;  // (from, to) -> attributes
};

Parsed parse(const std::string& dot) {
  Parsed p;
  std::istringstream in(dot);
  std::string line;
  const std::regex box(R"(^\s*(b\d+) \[.*label="([^"]*)\")");
  const std::regex edge(R"(^\s*(b\d+) -> (b\d+)(.*);$)");
  const std::regex cluster(R"(subgraph cluster_\d+ \{)");
  const std::regex label(R"(label="([^"]*)\")");
  bool in_cluster = false;
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_search(line, cluster)) {
      in_cluster = true;
      continue;
    }
    if (in_cluster && std::regex_search(line, m, label)) {
      p.clusters.push_back(m[1]);
      in_cluster = false;
      continue;
    }
    if (std::regex_search(line, m, edge))
      p.edges[{m[1], m[2]}] = m[3];
    else if (std::regex_search(line, m, box))
      p.label_of[m[1]] = m[2];
  }
  return p;
}

// Depth-first search for a cycle among the boxes.
bool has_cycle(const Parsed& p) {
  std::map<std::string, std::vector<std::string>> succ;
  for (const auto& [e, attrs] : p.edges) succ[e.first].push_back(e.second);
  std::map<std::string, int> state;
  std::function<bool(const std::string&)> visit = [&](const std::string& v) {
    state[v] = 1;
    for (const auto& w : succ[v])
      if (state[w] == 1 || (state[w] == 0 && visit(w))) return true;
    state[v] = 2;
    return false;
  };
  for (const auto& [v, l] : p.label_of)
    if (state[v] == 0 && visit(v)) return true;
  return false;
}

std::string summary_of(const Graph& g) {
  std::ostringstream out;
  g.dump_dot(out, {.detail = DotDetail::summary});
  return out.str();
}

// Two layers, each: three forward nodes in a chain, a gradient allreduce, an update.
Graph two_layer_graph(std::vector<float>& g0, std::vector<float>& g1) {
  Graph g;
  auto noop = [] {};
  Task previous;
  std::vector<float>* grads[] = {&g0, &g1};
  for (int layer = 0; layer < 2; ++layer) {
    const std::string group = "layer " + std::to_string(layer);
    auto a = g.compute("l" + std::to_string(layer) + "a", noop, {.group = group});
    auto b = g.compute("l" + std::to_string(layer) + "b", noop, {.group = group});
    auto c = g.compute("l" + std::to_string(layer) + "c", noop, {.group = group});
    auto ar = g.allreduce("l" + std::to_string(layer) + "grad",
                          Buffer::of(std::span(*grads[layer])), ReduceOp::sum, {.group = group});
    auto update = g.compute("l" + std::to_string(layer) + "update", noop, {.group = group});
    a.precede(b);
    b.precede(c);
    c.precede(ar);
    ar.precede(update);
    if (previous.valid()) previous.precede(a);
    previous = c;
  }
  return g;
}

TEST(DotSummary, OneClusterPerGroupComputeRunsCollapsedCommunicationKept) {
  std::vector<float> g0(1000), g1(1000);
  const Graph g = two_layer_graph(g0, g1);
  const Parsed p = parse(summary_of(g));
  EXPECT_EQ(p.clusters, (std::vector<std::string>{"layer 0 (5 nodes)", "layer 1 (5 nodes)"}));
  // Per layer: the run a..c (3 nodes), the allreduce, the update: 6 boxes for 10 nodes.
  ASSERT_EQ(p.label_of.size(), 6u) << summary_of(g);
  std::multiset<std::string> kinds;
  for (const auto& [id, label] : p.label_of) {
    if (label.find("3 compute nodes") == 0)
      kinds.insert("run");
    else if (label.find("allreduce float32[1000] sum") != std::string::npos)
      kinds.insert("allreduce");
    else if (label.find("update") != std::string::npos)
      kinds.insert("update");
  }
  EXPECT_EQ(kinds, (std::multiset<std::string>{"run", "run", "allreduce", "allreduce", "update",
                                               "update"}));
  // Layer 0's run feeds layer 0's allreduce and layer 1's run: 5 box edges for 12 node edges
  // inside runs collapsed.
  EXPECT_EQ(p.edges.size(), 5u);
  EXPECT_FALSE(has_cycle(p));
}

TEST(DotSummary, EdgesBetweenTwoBoxesAreBundledWithTheirCount) {
  Graph g;
  auto noop = [] {};
  std::vector<Task> producers, consumers;
  for (int k = 0; k < 4; ++k)
    producers.push_back(g.compute("p" + std::to_string(k), noop, {.group = "producers"}));
  for (int k = 0; k < 3; ++k)
    consumers.push_back(g.compute("c" + std::to_string(k), noop, {.group = "consumers"}));
  for (auto& p : producers)
    for (auto& c : consumers) p.precede(c);
  const Parsed parsed = parse(summary_of(g));
  ASSERT_EQ(parsed.label_of.size(), 2u);
  ASSERT_EQ(parsed.edges.size(), 1u);
  EXPECT_NE(parsed.edges.begin()->second.find("label=\"12\""), std::string::npos)
      << parsed.edges.begin()->second;
}

// A compute chain that leaves a group and comes back (A -> B -> A) must not become one box for
// A: the boxes would form a cycle.
TEST(DotSummary, ARunIsSplitWhereJoiningItWouldMakeACycle) {
  Graph g;
  auto noop = [] {};
  auto a1 = g.compute("a1", noop, {.group = "A"});
  auto b1 = g.compute("b1", noop, {.group = "B"});
  auto a2 = g.compute("a2", noop, {.group = "A"});
  auto a3 = g.compute("a3", noop, {.group = "A"});  // independent of b1: joins a1's run
  a1.precede(b1, a3);
  b1.precede(a2);
  const Parsed p = parse(summary_of(g));
  EXPECT_EQ(p.label_of.size(), 3u) << summary_of(g);  // {a1, a3}, {b1}, {a2}
  EXPECT_FALSE(has_cycle(p));
}

TEST(DotSummary, GroupsDefaultToTheNamePrefixAndManyGroupsMergeIntoStages) {
  Graph g;
  auto noop = [] {};
  Task previous;
  for (int k = 0; k < 40; ++k) {  // 40 groups "backward<k>" > 24: one stage "backward"
    auto t = g.compute("backward" + std::to_string(k) + ".weights", noop);
    EXPECT_EQ(t.group(), "backward" + std::to_string(k));
    if (previous.valid()) previous.precede(t);
    previous = t;
  }
  const Parsed p = parse(summary_of(g));
  EXPECT_EQ(p.clusters, (std::vector<std::string>{"backward (40 nodes)"}));
  ASSERT_EQ(p.label_of.size(), 1u);
  EXPECT_EQ(p.label_of.begin()->second.rfind("40 compute nodes", 0), 0u);
}

TEST(DotSummary, ManyCollectivesMergeIntoRunsOfConsecutiveOperations) {
  // 64 buckets: pack (compute) -> allreduce -> unpack (compute), as a deep model with small
  // buckets has. 64 allreduces > 48: runs of 2 consecutive allreduces, every pack in one box,
  // every unpack in another.
  Graph g;
  std::vector<std::vector<float>> grads(64, std::vector<float>(8));
  for (int b = 0; b < 64; ++b) {
    const std::string name = "bucket" + std::to_string(b);
    auto pack = g.compute(name + ".pack", [] {});
    auto reduce = g.allreduce(name + ".allreduce", Buffer::of(std::span(grads[b])));
    auto unpack = g.compute(name + ".unpack", [] {});
    pack.precede(reduce);
    reduce.precede(unpack);
  }
  auto backend = make_local_backend();
  Executor ex(g, *backend);
  std::ostringstream out;
  ex.dump_dot(out, {.detail = DotDetail::summary});
  const Parsed p = parse(out.str());
  std::size_t collective_boxes = 0, runs = 0;
  for (const auto& [id, label] : p.label_of) {
    if (label.rfind("2 x allreduce", 0) == 0) {
      ++collective_boxes;
      EXPECT_NE(label.find("issue #"), std::string::npos) << label;
      EXPECT_NE(label.find("64 B"), std::string::npos) << label;  // 2 x 8 floats
    }
    if (label.rfind("64 compute nodes", 0) == 0) ++runs;
  }
  EXPECT_EQ(collective_boxes, 32u) << out.str();
  EXPECT_EQ(runs, 2u) << out.str();  // all packs, all unpacks
  EXPECT_EQ(p.label_of.size(), 34u);
  EXPECT_NE(out.str().find("issue #0 .. #1"), std::string::npos);
  EXPECT_FALSE(has_cycle(p));
}

TEST(DotSummary, AutomaticDetailSwitchesAboveTheThreshold) {
  Graph g;
  for (int k = 0; k < 5; ++k) g.compute("n" + std::to_string(k) + ".x", [] {});
  std::ostringstream full, summary;
  g.dump_dot(full, {.detail = DotDetail::automatic, .summary_above = 5});
  g.dump_dot(summary, {.detail = DotDetail::automatic, .summary_above = 4});
  EXPECT_EQ(full.str().find("summary:"), std::string::npos);
  EXPECT_NE(summary.str().find("summary: 5 nodes"), std::string::npos) << summary.str();
}

TEST(DotSummary, ProfiledRunShowsTimesExposedCommunicationAndTheCriticalPath) {
  std::vector<float> g0(1 << 16), g1(1 << 16);
  const Graph g = two_layer_graph(g0, g1);
  auto backend = make_local_backend();
  Executor ex(g, *backend, {.profile = true});
  ex.run();
  std::ostringstream out;
  ex.dump_dot(out, {.detail = DotDetail::summary});
  const std::string dot = out.str();
  EXPECT_NE(dot.find("critical path"), std::string::npos);
  EXPECT_NE(dot.find("exposed communication"), std::string::npos);
  EXPECT_NE(dot.find("times add up to "), std::string::npos);  // a run's total time
  EXPECT_NE(dot.find("issue #1"), std::string::npos);
  EXPECT_NE(dot.find("color=\"#d62728\""), std::string::npos);  // something on the path
  EXPECT_NE(dot.find("cluster_legend"), std::string::npos);
  if (std::system("dot -V > /dev/null 2>&1") != 0) GTEST_SKIP() << "graphviz 'dot' not installed";
  const std::string path = ::testing::TempDir() + "summary.dot";
  std::ofstream(path) << dot;
  EXPECT_EQ(std::system(("dot -Tsvg '" + path + "' -o '" + path + ".svg'").c_str()), 0) << dot;
}

}  // namespace
}  // namespace loom
