// measure_overlap: unions of compute and communication intervals, worked out by hand.
#include <gtest/gtest.h>

#include <vector>

#include "loom/overlap_metrics.hpp"

namespace loom {
namespace {

constexpr std::int64_t ms = 1'000'000;

NodeTiming span(NodeKind kind, std::int64_t start_ms, std::int64_t end_ms) {
  NodeTiming t;
  t.name = "n";
  t.kind = kind;
  t.start_ns = start_ms * ms;
  t.end_ns = end_ms * ms;
  return t;
}

// compute [0,10] [5,15] [20,30] (union 25), comm [8,22] [25,40] (union 29), all [0,40] (40):
// both run during [8,15], [20,22] and [25,30] = 14 ms.
TEST(OverlapMetrics, UnionsByHand) {
  const std::vector<NodeTiming> timings{
      span(NodeKind::compute, 0, 10),    span(NodeKind::compute, 5, 15),
      span(NodeKind::copy, 20, 30),      span(NodeKind::collective, 8, 22),
      span(NodeKind::send, 25, 40),      span(NodeKind::compute, 0, 0),  // did not run
      span(NodeKind::collective, 50, 50)                                 // empty
  };
  const OverlapMetrics m = measure_overlap(timings);
  EXPECT_DOUBLE_EQ(m.compute_ms, 25);
  EXPECT_DOUBLE_EQ(m.comm_ms, 29);
  EXPECT_DOUBLE_EQ(m.busy_ms, 40);
  EXPECT_DOUBLE_EQ(m.hidden_ms, 14);
  EXPECT_DOUBLE_EQ(m.exposed_comm_ms, 15);
  EXPECT_DOUBLE_EQ(m.overlap_efficiency, 14.0 / 29.0);
}

TEST(OverlapMetrics, SequentialPhasesHideNothing) {
  const std::vector<NodeTiming> timings{
      span(NodeKind::compute, 0, 10), span(NodeKind::collective, 10, 14),
      span(NodeKind::recv, 12, 16), span(NodeKind::compute, 16, 17)};
  const OverlapMetrics m = measure_overlap(timings);
  EXPECT_DOUBLE_EQ(m.compute_ms, 11);
  EXPECT_DOUBLE_EQ(m.comm_ms, 6);
  EXPECT_DOUBLE_EQ(m.hidden_ms, 0);
  EXPECT_DOUBLE_EQ(m.exposed_comm_ms, 6);
  EXPECT_DOUBLE_EQ(m.overlap_efficiency, 0);
}

TEST(OverlapMetrics, FullyHiddenAndNoCommunication) {
  const std::vector<NodeTiming> hidden{span(NodeKind::compute, 0, 20),
                                       span(NodeKind::collective, 5, 9)};
  EXPECT_DOUBLE_EQ(measure_overlap(hidden).overlap_efficiency, 1.0);
  EXPECT_DOUBLE_EQ(measure_overlap(hidden).exposed_comm_ms, 0);
  const std::vector<NodeTiming> compute_only{span(NodeKind::compute, 0, 3)};
  EXPECT_DOUBLE_EQ(measure_overlap(compute_only).overlap_efficiency, 0);
  EXPECT_DOUBLE_EQ(measure_overlap(compute_only).comm_ms, 0);
  EXPECT_DOUBLE_EQ(measure_overlap({}).busy_ms, 0);
}

}  // namespace
}  // namespace loom
