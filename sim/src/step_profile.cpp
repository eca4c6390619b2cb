// StepProfile: built from a Graph and profiled runs; written to and read from JSON.
#include "loom/step_profile.hpp"

#include <fstream>
#include <map>
#include <ostream>
#include <sstream>

#include "json.hpp"
#include "json_quoted.hpp"
#include "loom/algorithm_selector.hpp"
#include "loom/error.hpp"
#include "loom/output_file.hpp"

namespace loom {

namespace {

double mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0 : sum / static_cast<double>(v.size());
}

NodeKind parse_node_kind(const std::string& text) {
  for (NodeKind k : {NodeKind::compute, NodeKind::collective, NodeKind::send, NodeKind::recv,
                     NodeKind::copy, NodeKind::external})
    if (to_string(k) == text) return k;
  throw Error(ErrorCode::invalid_argument, "step profile: unknown node kind '" + text + "'");
}

}  // namespace

StepProfile profile_step(const Graph& graph, std::span<const std::vector<NodeTiming>> runs) {
  StepProfile profile;
  std::map<std::string, std::size_t, std::less<>> ids;
  for (std::size_t id = 0; id < graph.size(); ++id) {
    const Task task = graph.task(id);
    ProfiledNode node;
    node.name = task.name();
    node.kind = task.kind();
    node.priority = task.priority();
    if (node.kind != NodeKind::compute && node.kind != NodeKind::external) {
      const CollectiveArgs& args = task.collective();
      node.op = args.op;
      node.bytes = node.kind == NodeKind::collective ? selection_bytes(args) : args.send.bytes();
    }
    ids[node.name] = id;
    profile.nodes.push_back(std::move(node));
  }
  profile.edges = graph.edges();
  std::vector<std::vector<double>> durations(profile.nodes.size());
  for (const auto& run : runs)
    for (const NodeTiming& t : run) {
      if (t.start_ns == 0 && t.end_ns == 0) continue;
      // By the task id the timing carries when it is this graph's node of that name (the
      // runs of the graph itself); by name otherwise (runs of another graph with those nodes).
      std::size_t id = t.task;
      if (id >= profile.nodes.size() || profile.nodes[id].name != t.name) {
        const auto it = ids.find(t.name);
        if (it == ids.end()) continue;
        id = it->second;
      }
      durations[id].push_back(static_cast<double>(t.end_ns - t.start_ns) * 1e-9);
      profile.nodes[id].issue_index = t.issue_index;
    }
  for (std::size_t id = 0; id < durations.size(); ++id)
    profile.nodes[id].duration_s = mean(durations[id]);
  return profile;
}

void write_step_profile(const StepProfile& p, std::ostream& out) {
  out.precision(9);
  out << "{\"loom-step-profile\": 1, \"label\": " << json_quoted(p.label)
      << ", \"backend\": " << json_quoted(p.backend) << ", \"ranks\": " << p.ranks
      << ", \"workers\": " << p.workers
      << ", \"collectives_in_flight\": " << p.collectives_in_flight
      << ", \"measured_step_s\": " << p.measured_step_s
      << ", \"measured_comm_s\": " << p.measured_comm_s
      << ", \"measured_compute_s\": " << p.measured_compute_s << ",\n \"nodes\": [\n";
  for (std::size_t i = 0; i < p.nodes.size(); ++i) {
    const ProfiledNode& n = p.nodes[i];
    out << "  {\"name\": " << json_quoted(n.name) << ", \"kind\": \"" << to_string(n.kind)
        << "\", \"priority\": " << n.priority;
    if (communicates(n.kind)) out << ", \"op\": \"" << to_string(n.op) << "\"";
    out << ", \"bytes\": " << n.bytes << ", \"duration_s\": " << n.duration_s
        << ", \"issue_index\": " << n.issue_index << "}" << (i + 1 < p.nodes.size() ? ",\n" : "\n");
  }
  out << " ],\n \"edges\": [";
  for (std::size_t i = 0; i < p.edges.size(); ++i)
    out << (i ? ", " : "") << "[" << p.edges[i].first << ", " << p.edges[i].second << "]";
  out << "]}\n";
}

void save_step_profile(const StepProfile& profile, const std::string& path) {
  std::ofstream out = open_output_file(path, "step profile");
  write_step_profile(profile, out);
  close_output_file(out, path, "step profile");
}

StepProfile read_step_profile(std::istream& in) {
  std::stringstream text;
  text << in.rdbuf();
  const sim::Json doc = sim::parse_json(text.str());
  if (doc.find("loom-step-profile") == nullptr)
    throw Error(ErrorCode::invalid_argument,
                "not a step profile (no \"loom-step-profile\" member)");
  StepProfile p;
  auto text_of = [&](std::string_view key) {
    const sim::Json* v = doc.find(key);
    return v ? v->as_string(key) : std::string();
  };
  auto number_of = [&](std::string_view key, double fallback) {
    const sim::Json* v = doc.find(key);
    return v ? v->as_number(key) : fallback;
  };
  p.label = text_of("label");
  p.backend = text_of("backend");
  p.ranks = static_cast<int>(number_of("ranks", 1));
  p.workers = static_cast<int>(number_of("workers", 1));
  p.collectives_in_flight = static_cast<std::size_t>(number_of("collectives_in_flight", 0));
  p.measured_step_s = number_of("measured_step_s", 0);
  p.measured_comm_s = number_of("measured_comm_s", 0);
  p.measured_compute_s = number_of("measured_compute_s", 0);  // absent in older profiles
  if (p.ranks < 1 || p.workers < 1)
    throw Error(ErrorCode::invalid_argument, "step profile: ranks and workers must be >= 1");
  for (const sim::Json& n : doc.at("nodes").as_array("nodes")) {
    ProfiledNode node;
    node.name = n.at("name").as_string("name");
    node.kind = parse_node_kind(n.at("kind").as_string("kind"));
    if (const sim::Json* v = n.find("priority"))
      node.priority = static_cast<int>(v->as_number("priority"));
    if (const sim::Json* v = n.find("op")) node.op = parse_collective(v->as_string("op"));
    if (const sim::Json* v = n.find("bytes"))
      node.bytes = static_cast<std::size_t>(v->as_number("bytes"));
    node.duration_s = n.at("duration_s").as_number("duration_s");
    if (const sim::Json* v = n.find("issue_index"))
      node.issue_index = static_cast<std::int64_t>(v->as_number("issue_index"));
    if (node.duration_s < 0)
      throw Error(ErrorCode::invalid_argument,
                  "step profile: node '" + node.name + "' has a negative duration");
    p.nodes.push_back(std::move(node));
  }
  for (const sim::Json& e : doc.at("edges").as_array("edges")) {
    const auto& pair = e.as_array("edges");
    if (pair.size() != 2)
      throw Error(ErrorCode::invalid_argument, "step profile: an edge is not [from, to]");
    const double from = pair[0].as_number("edges"), to = pair[1].as_number("edges");
    if (from < 0 || to < 0 || from >= static_cast<double>(p.nodes.size()) ||
        to >= static_cast<double>(p.nodes.size()))
      throw Error(ErrorCode::invalid_argument, "step profile: edge [" +
                                                   std::to_string(static_cast<long>(from)) + ", " +
                                                   std::to_string(static_cast<long>(to)) +
                                                   "] names a node outside the profile's " +
                                                   std::to_string(p.nodes.size()) + " nodes");
    p.edges.emplace_back(static_cast<std::size_t>(from), static_cast<std::size_t>(to));
  }
  return p;
}

StepProfile load_step_profile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(ErrorCode::invalid_argument, "cannot read the step profile '" + path + "'");
  try {
    return read_step_profile(in);
  } catch (const Error& e) {
    throw Error(ErrorCode::invalid_argument, path + ": " + e.what());
  }
}

}  // namespace loom
