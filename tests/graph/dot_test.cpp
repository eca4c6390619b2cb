// Every DOT file loom writes (graph before compile, executor before and after a run) must be
// accepted by Graphviz.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "loom/executor.hpp"
#include "loom/graph.hpp"
#include "loom/local.hpp"

namespace loom {
namespace {

bool have_dot() {
  return std::system("dot -V > /dev/null 2>&1") == 0;
}

// Writes `text` to a file and runs `dot -Tsvg` on it; returns dot's exit status.
int graphviz_status(const std::string& text, const std::string& name) {
  const std::string path = ::testing::TempDir() + name + ".dot";
  std::ofstream(path) << text;
  const std::string cmd = "dot -Tsvg '" + path + "' -o '" + path + ".svg' 2> '" + path + ".err'";
  return std::system(cmd.c_str());
}

// A graph with every node kind, awkward names and a critical path through a slow node.
Graph sample_graph(std::vector<float>& x, std::vector<float>& y, std::vector<float>& z) {
  Graph g;
  auto load = g.compute("load \"batch\" {1}", [] {});
  auto fwd =
      g.compute("forward\\layer", [] { std::this_thread::sleep_for(std::chrono::milliseconds(2)); },
                {.priority = 2});
  auto side = g.compute("side<>|", [] {});
  auto ar = g.allreduce("grads", Buffer::of(std::span(x)));
  auto bc = g.broadcast("params", Buffer::of(std::span(y)), 0);
  auto cp = g.copy("stage", Buffer::of(std::span(x)), Buffer::of(std::span(z)));
  auto bar = g.barrier("sync");
  load.precede(fwd, side);
  fwd.precede(ar);
  side.precede(bc);
  ar.precede(cp);
  bar.succeed(cp, bc);
  return g;
}

TEST(Dot, GraphvizAcceptsTheGraphBeforeCompile) {
  if (!have_dot()) GTEST_SKIP() << "graphviz 'dot' is not installed; cannot check the DOT output";
  std::vector<float> x(1000), y(10), z(1000);
  Graph g = sample_graph(x, y, z);
  std::ostringstream dot;
  g.dump_dot(dot);
  EXPECT_EQ(graphviz_status(dot.str(), "graph_before_compile"), 0) << dot.str();
}

TEST(Dot, GraphvizAcceptsTheExecutorBeforeAndAfterARun) {
  if (!have_dot()) GTEST_SKIP() << "graphviz 'dot' is not installed; cannot check the DOT output";
  auto backend = make_local_backend();
  std::vector<float> x(1000), y(10), z(1000);
  Graph g = sample_graph(x, y, z);
  ExecutorOptions options;
  options.profile = true;
  Executor ex(g, *backend, options);
  std::ostringstream before;
  ex.dump_dot(before);
  EXPECT_NE(before.str().find("issue #0"), std::string::npos);
  EXPECT_NE(before.str().find("algo native"), std::string::npos);
  EXPECT_EQ(graphviz_status(before.str(), "executor_before_run"), 0) << before.str();
  ex.run();
  std::ostringstream after;
  ex.dump_dot(after);
  const std::string text = after.str();
  EXPECT_NE(text.find("critical path"), std::string::npos);
  EXPECT_NE(text.find("penwidth=3"), std::string::npos);
  EXPECT_NE(text.find(" us"), std::string::npos);
  EXPECT_EQ(graphviz_status(text, "executor_after_run"), 0) << text;
  // The 2 ms forward node is on the critical path.
  const auto forward = text.find("forward\\\\layer");
  ASSERT_NE(forward, std::string::npos);
  const auto line_end = text.find('\n', forward);
  EXPECT_NE(text.substr(forward, line_end - forward).find("#d62728"), std::string::npos);
}

}  // namespace
}  // namespace loom
