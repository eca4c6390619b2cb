// Annotation: what a profiled run recorded, handed out as NodeTiming, Chrome-trace spans and
// DOT annotations (issue indices, algorithms, durations, the critical path).
#include <algorithm>
#include <fstream>
#include <ostream>

#include "analysis.hpp"
#include "dot_writer.hpp"
#include "executor_impl.hpp"
#include "intervals.hpp"
#include "loom/error.hpp"
#include "loom/output_file.hpp"

namespace loom {

namespace {}  // namespace

using detail::NodeData;
using detail::NodeRecord;

std::vector<detail::TraceSpan> Executor::Impl::spans() const {
  std::vector<detail::TraceSpan> out;
  if (!profile.has_run) return out;
  for (std::uint32_t i = 0; i < graph.nodes.size(); ++i) {
    const NodeData& node = graph.nodes[i];
    const NodeRecord& r = profile.records[i];
    if (r.end_ns == 0 && r.start_ns == 0) continue;  // did not run (a failed run)
    const bool comm = plan.communicates(i);
    const bool outside = node.kind == NodeKind::external;
    // Every communication node uses the one communicator of the backend: one lane family.
    out.push_back({node.name, std::string(to_string(node.kind)), detail::describe(node), r.start_ns,
                   r.end_ns, comm || outside ? -1 : std::max(r.lane, 0), comm ? "world" : "",
                   detail::bytes_of(node), algorithms.algorithm(plan, i), plan.issue_index[i],
                   r.ready_ns, outside});
  }
  return out;
}

void Executor::Impl::write_trace_file() const {
  std::string path = *options.trace_path;
  if (backend.world_size() > 1) {
    const auto dot = path.rfind('.');
    const auto slash = path.rfind('/');
    const std::string suffix = ".rank" + std::to_string(backend.rank());
    if (dot == std::string::npos || (slash != std::string::npos && dot < slash))
      path += suffix;
    else
      path.insert(dot, suffix);
  }
  std::ofstream out = open_output_file(path, "trace file");
  detail::write_chrome_trace(out, profile.clock(backend.rank(), backend.world_size()), spans());
}

std::vector<NodeTiming> Executor::last_run() const {
  std::vector<NodeTiming> out;
  const Impl& m = *_impl;
  if (!m.profile.has_run) return out;
  for (std::uint32_t i = 0; i < m.graph.nodes.size(); ++i) {
    const NodeData& node = m.graph.nodes[i];
    const NodeRecord& r = m.profile.records[i];
    out.push_back({node.name, node.kind, r.start_ns, r.end_ns, r.lane, detail::bytes_of(node),
                   m.plan.issue_index[i], m.algorithms.algorithm(m.plan, i),
                   m.algorithms.reason(m.plan, i), m.plan.communicates(i) ? r.ready_ns : -1, i});
  }
  return out;
}

namespace {

// Per communication node: how long of its [issue, completion] no compute of this rank ran.
std::vector<double> exposed_us(const detail::GraphState& graph,
                               const std::vector<NodeRecord>& records) {
  std::vector<detail::Interval> busy;
  auto computes = [&](std::uint32_t i) {
    const NodeKind kind = graph.nodes[i].kind;
    return kind == NodeKind::compute || kind == NodeKind::copy || kind == NodeKind::external;
  };
  for (std::uint32_t i = 0; i < graph.nodes.size(); ++i)
    if (computes(i) && records[i].end_ns > 0)
      busy.emplace_back(records[i].start_ns, records[i].end_ns);
  busy = detail::merged(std::move(busy));
  std::vector<double> out(graph.nodes.size(), 0);
  for (std::uint32_t i = 0; i < graph.nodes.size(); ++i)
    if (!computes(i) && records[i].end_ns > 0)
      out[i] =
          detail::length(detail::uncovered(records[i].start_ns, records[i].end_ns, busy)) / 1000.0;
  return out;
}

}  // namespace

void Executor::dump_dot(std::ostream& out, DotOptions options) const {
  const Impl& m = *_impl;
  const auto& g = m.graph;
  detail::DotAnnotations notes;
  notes.issue_index = m.plan.issue_index;
  notes.algorithm.resize(g.nodes.size());
  for (std::uint32_t i = 0; i < g.nodes.size(); ++i)
    notes.algorithm[i] = m.algorithms.algorithm(m.plan, i);
  if (m.profile.has_run) {
    notes.duration_us.resize(g.nodes.size());
    for (std::uint32_t i = 0; i < g.nodes.size(); ++i) {
      const NodeRecord& r = m.profile.records[i];
      notes.duration_us[i] = std::max<double>(r.end_ns - r.start_ns, 0) / 1000.0;
    }
    notes.critical_path = detail::critical_path(g, notes.duration_us);
    for (std::uint32_t v : notes.critical_path) notes.critical_path_us += notes.duration_us[v];
    notes.exposed_us = exposed_us(g, m.profile.records);
  }
  detail::write_dot(out, g, &notes, options);
}

void Executor::write_trace(std::ostream& out) const {
  const Impl& m = *_impl;
  detail::write_chrome_trace(out, m.profile.clock(m.backend.rank(), m.backend.world_size()),
                             m.spans());
}

void Executor::write_trace(const std::string& path) const {
  std::ofstream out = open_output_file(path, "trace file");
  write_trace(out);
}

}  // namespace loom
