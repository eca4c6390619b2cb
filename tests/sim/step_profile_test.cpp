// Tests of sim/step_profile: a Graph and profiled runs to a profile, its JSON round trip, bad
// files.
#include "loom/step_profile.hpp"

#include <gtest/gtest.h>

#include <sstream>
#include <vector>

#include "expect_error.hpp"
#include "loom/error.hpp"

namespace loom {
namespace {

using test::expect_error;

TEST(StepProfile, FromAGraphAndRunsTakesMeans) {
  std::vector<float> grad(256);
  Graph g;
  Task backward = g.compute("backward", [] {}, {.priority = 1});
  Task reduce = g.allreduce("reduce", Buffer(grad.data(), grad.size(), DType::float32),
                            ReduceOp::sum, {.priority = 3});
  Task update = g.compute("update", [] {});
  backward.precede(reduce);
  reduce.precede(update);
  auto run = [](std::int64_t backward_ns, std::int64_t reduce_ns) {
    return std::vector<NodeTiming>{
        {.name = "backward", .kind = NodeKind::compute, .start_ns = 0, .end_ns = backward_ns},
        {.name = "reduce",
         .kind = NodeKind::collective,
         .start_ns = backward_ns,
         .end_ns = backward_ns + reduce_ns,
         .bytes = 1024,
         .issue_index = 0},
        {.name = "update", .kind = NodeKind::compute, .start_ns = 0, .end_ns = 0}};
  };
  const std::vector<std::vector<NodeTiming>> runs{run(1000, 5000), run(3000, 6000),
                                                  run(2000, 10000)};
  const StepProfile p = profile_step(g, runs);
  ASSERT_EQ(p.nodes.size(), 3u);
  EXPECT_NEAR(p.nodes[0].duration_s, 2e-6, 1e-15);
  EXPECT_EQ(p.nodes[0].priority, 1);
  EXPECT_EQ(p.nodes[1].kind, NodeKind::collective);
  EXPECT_EQ(p.nodes[1].op, Collective::allreduce);
  EXPECT_EQ(p.nodes[1].bytes, 1024u);
  EXPECT_EQ(p.nodes[1].priority, 3);
  EXPECT_EQ(p.nodes[1].issue_index, 0);
  EXPECT_NEAR(p.nodes[1].duration_s, 7e-6, 1e-15);
  EXPECT_EQ(p.nodes[2].duration_s, 0);  // never ran
  EXPECT_EQ(p.edges, (std::vector<std::pair<std::size_t, std::size_t>>{{0, 1}, {1, 2}}));
}

TEST(StepProfile, JsonRoundTrip) {
  StepProfile p;
  p.label = "a \"quoted\" label";
  p.backend = "mpi";
  p.ranks = 3;
  p.workers = 2;
  p.collectives_in_flight = 1;
  p.measured_step_s = 0.0125;
  p.measured_comm_s = 0.004;
  p.measured_compute_s = 0.0081;
  p.nodes = {{.name = "f", .kind = NodeKind::compute, .priority = 2, .duration_s = 1.5e-3},
             {.name = "g",
              .kind = NodeKind::collective,
              .op = Collective::reduce_scatter,
              .bytes = 4096,
              .duration_s = 2e-3,
              .issue_index = 0}};
  p.edges = {{0, 1}};
  std::stringstream text;
  write_step_profile(p, text);
  const StepProfile q = read_step_profile(text);
  EXPECT_EQ(q.label, p.label);
  EXPECT_EQ(q.backend, "mpi");
  EXPECT_EQ(q.ranks, 3);
  EXPECT_EQ(q.workers, 2);
  EXPECT_EQ(q.collectives_in_flight, 1u);
  EXPECT_DOUBLE_EQ(q.measured_step_s, 0.0125);
  EXPECT_DOUBLE_EQ(q.measured_comm_s, 0.004);
  EXPECT_DOUBLE_EQ(q.measured_compute_s, 0.0081);
  ASSERT_EQ(q.nodes.size(), 2u);
  EXPECT_EQ(q.nodes[0].priority, 2);
  EXPECT_DOUBLE_EQ(q.nodes[0].duration_s, 1.5e-3);
  EXPECT_EQ(q.nodes[1].op, Collective::reduce_scatter);
  EXPECT_EQ(q.nodes[1].bytes, 4096u);
  EXPECT_EQ(q.nodes[1].issue_index, 0);
  EXPECT_EQ(q.edges, p.edges);
}

TEST(StepProfile, BadFilesAreNamed) {
  auto read = [](const std::string& text) {
    std::stringstream in(text);
    return read_step_profile(in);
  };
  expect_error(ErrorCode::invalid_argument, "not a step profile (no \"loom-step-profile\" member)",
               [&] { read("{\"nodes\": [], \"edges\": []}"); });
  expect_error(ErrorCode::invalid_argument,
               "step profile: edge [0, 1] names a node outside the profile's 0 nodes",
               [&] { read("{\"loom-step-profile\": 1, \"nodes\": [], \"edges\": [[0, 1]]}"); });
  expect_error(ErrorCode::invalid_argument, "step profile: unknown node kind 'teleport'", [&] {
    read(
        "{\"loom-step-profile\": 1, \"nodes\": [{\"name\": \"x\", \"kind\": "
        "\"teleport\", \"duration_s\": 0}], \"edges\": []}");
  });
  // Cut off after "[": the offset is the text's length (35).
  expect_error(ErrorCode::invalid_argument, "JSON: unexpected end at offset 35",
               [&] { read("{\"loom-step-profile\": 1, \"nodes\": ["); });
  expect_error(ErrorCode::invalid_argument,
               "cannot read the step profile '/nonexistent/profile.json'",
               [] { load_step_profile("/nonexistent/profile.json"); });
}

}  // namespace
}  // namespace loom
