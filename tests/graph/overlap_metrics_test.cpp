// measure_overlap: unions of compute and communication intervals, worked out by hand.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
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

// Times in ms; `issue` the issue index, `ready` when its predecessors were done.
NodeTiming comm(const std::string& name, std::int64_t issue, double ready, double start,
                double end) {
  NodeTiming t;
  t.name = name;
  t.kind = NodeKind::collective;
  t.issue_index = issue;
  t.ready_ns = static_cast<std::int64_t>(ready * 1e6);
  t.start_ns = static_cast<std::int64_t>(start * 1e6);
  t.end_ns = static_cast<std::int64_t>(end * 1e6);
  return t;
}

NodeTiming work(double start, double end, int lane = 0) {
  NodeTiming t;
  t.name = "compute";
  t.kind = NodeKind::compute;
  t.lane = lane;
  t.start_ns = static_cast<std::int64_t>(start * 1e6);
  t.end_ns = static_cast<std::int64_t>(end * 1e6);
  return t;
}

TEST(CommunicationReport, HiddenWhenComputeCoversItsWholeSpan) {
  const std::vector<NodeTiming> timings{work(0, 10), comm("a", 0, 2, 2, 8)};
  const auto r = explain_communication(timings, 2);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].reason, "hidden");
  EXPECT_DOUBLE_EQ(r[0].exposed_ms, 0);
  EXPECT_DOUBLE_EQ(r[0].ready_ms, 2);
  EXPECT_DOUBLE_EQ(r[0].completed_ms, 8);
}

TEST(CommunicationReport, ReadyButNotIssuedIsWaitingForTheIssueOrder) {
  // b is ready at 5 but issue #1: it goes only when a (issue #0) is done at 7.
  const std::vector<NodeTiming> timings{work(0, 5), comm("a", 0, 5, 5, 7), comm("b", 1, 5, 7, 8)};
  const auto r = explain_communication(timings, 2);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[1].name, "b");
  EXPECT_DOUBLE_EQ(r[1].waiting_for_order_ms, 2);
  EXPECT_DOUBLE_EQ(r[1].own_transfer_ms, 1);
  EXPECT_DOUBLE_EQ(r[1].exposed_ms, 3);
  EXPECT_EQ(r[1].reason, "waiting for the issue order");
  EXPECT_EQ(r[0].reason, "its own transfer");  // alone on an idle machine
  EXPECT_DOUBLE_EQ(r[0].own_transfer_ms, 2);
}

TEST(CommunicationReport, SharingTheWireNamesWhoItSharedItWith) {
  const std::vector<NodeTiming> timings{work(0, 4), comm("a", 0, 1, 1, 10), comm("b", 1, 4, 4, 9)};
  const auto r = explain_communication(timings, 2);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_DOUBLE_EQ(r[1].wire_busy_ms, 5);
  EXPECT_EQ(r[1].busy_with, "a");
  EXPECT_EQ(r[1].reason, "wire busy with a");
  // a: exposed 4..10; shared with b until 9, alone afterwards.
  EXPECT_DOUBLE_EQ(r[0].wire_busy_ms, 5);
  EXPECT_DOUBLE_EQ(r[0].own_transfer_ms, 1);
}

TEST(CommunicationReport, ComputeOnEveryCoreStarvesTheTransport) {
  // Two cores, both computing from 0 to 8 while c is in flight from 1 to 10: 7 of its 9 ms in
  // flight had no core, and its exposed tail (8..10) is blamed on that.
  const std::vector<NodeTiming> timings{work(0, 8, 0), work(0, 8, 1), comm("c", 0, 1, 1, 10)};
  const auto starved = explain_communication(timings, 2);
  ASSERT_EQ(starved.size(), 1u);
  EXPECT_DOUBLE_EQ(starved[0].cores_busy_ms, 7);
  EXPECT_DOUBLE_EQ(starved[0].starved_ms, 2);
  EXPECT_EQ(starved[0].reason, "transport starved of CPU");
  // With four cores the same timeline left cores free: its own transfer.
  const auto roomy = explain_communication(timings, 4);
  EXPECT_DOUBLE_EQ(roomy[0].cores_busy_ms, 0);
  EXPECT_EQ(roomy[0].reason, "its own transfer");
}

TEST(CommunicationReport, PrintsOneLinePerNodeInIssueOrder) {
  const std::vector<NodeTiming> timings{work(0, 4), comm("b", 1, 4, 4, 9), comm("a", 0, 1, 1, 10)};
  std::ostringstream out;
  const auto reports = explain_communication(timings, 2);
  print_communication_report(out, reports);
  const std::string text = out.str();
  EXPECT_LT(text.find("\na "), text.find("\nb ")) << text;
  EXPECT_NE(text.find("wire busy with a (order 0.00, wire 5.00"), std::string::npos) << text;
}

}  // namespace
}  // namespace loom
