// Graph building and validation: every validation error names the nodes involved.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "loom/error.hpp"
#include "loom/graph.hpp"

namespace loom {
namespace {

// Runs validate(world) and returns the message of the graph_invalid error it must throw.
std::string validation_error(const Graph& graph, int world = 2) {
  try {
    graph.validate(world);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::graph_invalid) << e.what();
    return e.message();
  }
  ADD_FAILURE() << "validate() accepted an invalid graph";
  return {};
}

void noop() {}

TEST(Graph, BuildsNodesAndEdges) {
  Graph g;
  std::vector<float> x(8);
  auto a = g.compute("a", noop);
  auto b = g.compute("b", noop);
  auto c = g.allreduce("c", Buffer::of(std::span(x)));
  a.precede(b, c);
  g.add_edge(b, c);
  EXPECT_EQ(g.size(), 3u);
  EXPECT_EQ(g.num_edges(), 3u);
  EXPECT_EQ(c.name(), "c");
  EXPECT_EQ(c.kind(), NodeKind::collective);
  EXPECT_EQ(g.find("b"), b);
  EXPECT_FALSE(g.find("nope").valid());
  Task copy = a;  // handles are values
  EXPECT_EQ(copy, a);
  EXPECT_NO_THROW(g.validate(2));
}

TEST(GraphValidation, CycleNamesTheNodesOnIt) {
  Graph g;
  auto start = g.compute("start", noop);
  auto a = g.compute("a", noop);
  auto b = g.compute("b", noop);
  auto c = g.compute("c", noop);
  start.precede(a);
  a.precede(b);
  b.precede(c);
  c.precede(a);
  const std::string message = validation_error(g);
  EXPECT_NE(message.find("cycle"), std::string::npos) << message;
  for (const char* name : {"'a'", "'b'", "'c'"})
    EXPECT_NE(message.find(name), std::string::npos) << message;
  EXPECT_EQ(message.find("'start'"), std::string::npos) << message;
}

TEST(GraphValidation, SelfEdgeNamesTheNode) {
  Graph g;
  auto a = g.compute("loop_me", noop);
  a.precede(a);
  const std::string message = validation_error(g);
  EXPECT_NE(message.find("self edge"), std::string::npos) << message;
  EXPECT_NE(message.find("'loop_me'"), std::string::npos) << message;
}

TEST(GraphValidation, DanglingEdgeToADefaultTaskNamesTheNode) {
  Graph g;
  auto a = g.compute("source", noop);
  a.precede(Task{});
  const std::string message = validation_error(g);
  EXPECT_NE(message.find("dangling edge"), std::string::npos) << message;
  EXPECT_NE(message.find("'source'"), std::string::npos) << message;
}

TEST(GraphValidation, DanglingEdgeToAnotherGraphNamesBothNodes) {
  Graph g, other;
  auto a = g.compute("here", noop);
  auto b = other.compute("elsewhere", noop);
  a.precede(b);
  const std::string message = validation_error(g);
  EXPECT_NE(message.find("'here'"), std::string::npos) << message;
  EXPECT_NE(message.find("'elsewhere'"), std::string::npos) << message;
  EXPECT_NE(message.find("another graph"), std::string::npos) << message;
}

TEST(GraphValidation, DuplicateNameIsAnError) {
  Graph g;
  g.compute("twice", noop);
  g.compute("twice", noop);
  const std::string message = validation_error(g);
  EXPECT_NE(message.find("duplicate name"), std::string::npos) << message;
  EXPECT_NE(message.find("'twice'"), std::string::npos) << message;
}

TEST(GraphValidation, AllreduceCountMismatchNamesTheNode) {
  Graph g;
  std::vector<float> send(8), recv(6);
  g.allreduce("grads", Buffer::of(std::span(send)), Buffer::of(std::span(recv)));
  const std::string message = validation_error(g);
  EXPECT_NE(message.find("'grads'"), std::string::npos) << message;
  EXPECT_NE(message.find("recv count 6"), std::string::npos) << message;
}

TEST(GraphValidation, DtypeMismatchNamesTheNode) {
  Graph g;
  std::vector<float> send(8);
  std::vector<double> recv(8);
  g.allreduce("mixed", Buffer::of(std::span(send)), Buffer::of(std::span(recv)));
  const std::string message = validation_error(g);
  EXPECT_NE(message.find("'mixed'"), std::string::npos) << message;
  EXPECT_NE(message.find("different dtypes"), std::string::npos) << message;
}

TEST(GraphValidation, AllgatherNeedsWorldTimesSend) {
  Graph g;
  std::vector<int> send(4), recv(10);
  g.allgather("gather", Buffer::of(std::span(send)), Buffer::of(std::span(recv)));
  EXPECT_NO_THROW(g.validate());  // world size unknown: nothing to compare with
  const std::string message = validation_error(g, 3);
  EXPECT_NE(message.find("'gather'"), std::string::npos) << message;
  EXPECT_NE(message.find("= 12"), std::string::npos) << message;
}

TEST(GraphValidation, ReduceScatterAndAlltoallCounts) {
  {
    Graph g;
    std::vector<float> send(9), recv(4);
    g.reduce_scatter("rs", Buffer::of(std::span(send)), Buffer::of(std::span(recv)));
    EXPECT_NE(validation_error(g, 2).find("'rs'"), std::string::npos);
  }
  {
    Graph g;
    std::vector<float> send(9), recv(9);
    g.alltoall("a2a", Buffer::of(std::span(send)), Buffer::of(std::span(recv)));
    const std::string message = validation_error(g, 2);
    EXPECT_NE(message.find("'a2a'"), std::string::npos) << message;
    EXPECT_NE(message.find("does not divide"), std::string::npos) << message;
  }
}

TEST(GraphValidation, RootOutOfRangeNamesTheNode) {
  Graph g;
  std::vector<float> x(4);
  g.broadcast("bcast", Buffer::of(std::span(x)), 3);
  const std::string message = validation_error(g, 2);
  EXPECT_NE(message.find("'bcast'"), std::string::npos) << message;
  EXPECT_NE(message.find("root 3"), std::string::npos) << message;
}

TEST(GraphValidation, AvgOnBoolIsRejected) {
  Graph g;
  std::vector<std::uint8_t> x(4);
  g.allreduce("flags_avg", Buffer(x.data(), x.size(), DType::boolean), ReduceOp::avg);
  const std::string message = validation_error(g);
  EXPECT_NE(message.find("'flags_avg'"), std::string::npos) << message;
  EXPECT_NE(message.find("avg is not defined for bool"), std::string::npos) << message;
}

TEST(GraphValidation, PeerOutOfRangeNamesTheNode) {
  Graph g;
  std::vector<float> x(4);
  g.send("to_nowhere", Buffer::of(std::span(x)), 5);
  const std::string message = validation_error(g, 2);
  EXPECT_NE(message.find("'to_nowhere'"), std::string::npos) << message;
  EXPECT_NE(message.find("peer 5"), std::string::npos) << message;
}

TEST(GraphValidation, CopySizeMismatchNamesTheNode) {
  Graph g;
  std::vector<float> src(4), dst(3);
  g.copy("cp", Buffer::of(std::span(src)), Buffer::of(std::span(dst)));
  const std::string message = validation_error(g);
  EXPECT_NE(message.find("'cp'"), std::string::npos) << message;
}

TEST(GraphValidation, ConcurrentWritersAreADataRaceNamingBoth) {
  Graph g;
  std::vector<float> x(16);
  auto whole = Buffer::of(std::span(x));
  auto a = g.compute("writer_a", noop, {.writes = {whole.slice(0, 8)}});
  auto b = g.compute("writer_b", noop, {.writes = {whole.slice(4, 8)}});
  (void)a;
  (void)b;
  const std::string message = validation_error(g);
  EXPECT_NE(message.find("data race"), std::string::npos) << message;
  EXPECT_NE(message.find("'writer_a'"), std::string::npos) << message;
  EXPECT_NE(message.find("'writer_b'"), std::string::npos) << message;
}

TEST(GraphValidation, CollectiveRacingWithComputeIsADataRace) {
  Graph g;
  std::vector<float> x(16);
  auto buffer = Buffer::of(std::span(x));
  g.allreduce("sum", buffer);
  g.compute("scribbler", noop, {.writes = {buffer.slice(15, 1)}});
  const std::string message = validation_error(g);
  EXPECT_NE(message.find("'sum'"), std::string::npos) << message;
  EXPECT_NE(message.find("'scribbler'"), std::string::npos) << message;
}

TEST(GraphValidation, OrderedOrDisjointAccessesAreNotRaces) {
  Graph g;
  std::vector<float> x(16);
  auto whole = Buffer::of(std::span(x));
  auto produce = g.compute("produce", noop, {.writes = {whole}});
  auto reduce = g.allreduce("reduce", whole);
  auto left = g.compute("left", noop, {.writes = {whole.slice(0, 8)}});
  auto right = g.compute("right", noop, {.writes = {whole.slice(8, 8)}});
  auto reader1 = g.compute("reader1", noop, {.reads = {whole}});
  auto reader2 = g.compute("reader2", noop, {.reads = {whole}});
  produce.precede(reduce);
  reduce.precede(left, right);
  left.precede(reader1, reader2);
  right.precede(reader1, reader2);
  EXPECT_NO_THROW(g.validate(4));
}

TEST(Graph, DumpDotDrawsComputeAndCommunicationDifferently) {
  Graph g;
  std::vector<float> x(256);
  auto a = g.compute("forward \"quoted\"", noop);
  auto b = g.allreduce("grads", Buffer::of(std::span(x)));
  a.precede(b);
  std::ostringstream dot;
  g.dump_dot(dot);
  const std::string text = dot.str();
  EXPECT_NE(text.find("digraph"), std::string::npos);
  EXPECT_NE(text.find("shape=box"), std::string::npos);
  EXPECT_NE(text.find("shape=hexagon"), std::string::npos);
  EXPECT_NE(text.find("1.0 KiB"), std::string::npos);
  EXPECT_NE(text.find("forward \\\"quoted\\\""), std::string::npos);
  EXPECT_NE(text.find("n0 -> n1"), std::string::npos);
}

}  // namespace
}  // namespace loom
