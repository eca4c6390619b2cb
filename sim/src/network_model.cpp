// NetworkModel: collective costs from the selector's formulas; link rates and durations parsed.
#include "loom/network_model.hpp"

#include <algorithm>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>

#include "loom/error.hpp"
#include "loom/step_profile.hpp"

namespace loom {

namespace {

// A number followed by a unit from `units` (lower case, with its factor); the whole text.
double number_with_unit(std::string_view text,
                        std::initializer_list<std::pair<const char*, double>> units,
                        const char* what) {
  const std::string s(text);
  char* end = nullptr;
  const double value = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || !std::isfinite(value) || value < 0)
    throw Error(ErrorCode::invalid_argument, std::string("bad ") + what + " '" + s + "'");
  std::string unit(end);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const auto& [name, factor] : units)
    if (unit == name) return value * factor;
  throw Error(ErrorCode::invalid_argument,
              std::string("bad ") + what + " '" + s + "': unknown unit '" + unit + "'");
}

}  // namespace

double parse_link_rate(std::string_view text) {
  const double rate = number_with_unit(text,
                                       {{"", 1},
                                        {"bit", 1},
                                        {"kbit", 1e3},
                                        {"mbit", 1e6},
                                        {"gbit", 1e9},
                                        {"tbit", 1e12},
                                        {"bps", 8},
                                        {"kbps", 8e3},
                                        {"mbps", 8e6},
                                        {"gbps", 8e9}},
                                       "link rate");
  if (rate <= 0)
    throw Error(ErrorCode::invalid_argument, "link rate '" + std::string(text) + "' is 0");
  return rate;
}

double parse_byte_rate(std::string_view text) {
  if (text.size() > 2 &&
      (text.substr(text.size() - 2) == "/s" || text.substr(text.size() - 2) == "/S")) {
    const double rate = number_with_unit(
        text.substr(0, text.size() - 2),
        {{"b", 1}, {"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12}}, "byte rate");
    if (rate <= 0)
      throw Error(ErrorCode::invalid_argument, "byte rate '" + std::string(text) + "' is 0");
    return rate;
  }
  return parse_link_rate(text) / 8;
}

double parse_duration(std::string_view text) {
  return number_with_unit(text, {{"", 1}, {"s", 1}, {"ms", 1e-3}, {"us", 1e-6}, {"ns", 1e-9}},
                          "duration");
}

NetworkModel::NetworkModel(TuningParameters tuning) : _selector(std::move(tuning)) {}

NetworkModel NetworkModel::from_link(double bits_per_s, double latency_s) {
  if (!(bits_per_s > 0) || latency_s < 0)
    throw Error(ErrorCode::invalid_argument, "a link needs a rate > 0 and a latency >= 0");
  TuningParameters t = default_tuning();
  t.cost.alpha_s = latency_s;
  t.cost.beta_s_per_byte = 8.0 / bits_per_s;
  t.native.clear();
  t.measured.clear();
  return NetworkModel(std::move(t));
}

NetworkModel NetworkModel::fitted(const StepProfile& profile, double latency_s) {
  if (!(profile.measured_comm_s > 0))
    throw Error(ErrorCode::invalid_argument,
                "fitting the wire needs the profile's measured_comm_s (a profiled run with "
                "communication)");
  // What the wire took: rank 0's communication intervals, or the time the step did not compute
  // where that is longer (the peers' share of a collective rank 0 issued late).
  double measured = profile.measured_comm_s;
  if (profile.measured_step_s > 0 && profile.measured_compute_s > 0)
    measured = std::max(measured, profile.measured_step_s - profile.measured_compute_s);
  // The wire time of the profile's communication at a trial beta; it grows with beta.
  auto wire = [&](double beta) {
    TuningParameters t = default_tuning();
    t.cost.alpha_s = latency_s;
    t.cost.beta_s_per_byte = beta;
    NetworkModel m(std::move(t));
    double total = 0;
    for (const ProfiledNode& n : profile.nodes) {
      if (n.kind == NodeKind::collective)
        total += m.collective(n.op, n.bytes, profile.ranks).seconds;
      else if (n.kind == NodeKind::send || n.kind == NodeKind::recv)
        total += m.point_to_point(n.bytes);
    }
    return total;
  };
  double lo = 1e-15, hi = 1e-5;  // 8e15 .. 8e5 bit/s
  for (int i = 0; i < 200 && hi / lo > 1.000001; ++i) {
    const double mid = std::sqrt(lo * hi);
    (wire(mid) < measured ? lo : hi) = mid;
  }
  return from_link(8.0 / std::sqrt(lo * hi), latency_s);
}

NetworkModel NetworkModel::two_level(ClusterNetwork cluster) {
  TuningParameters t = default_tuning();
  t.cost.alpha_s = cluster.link_latency_s;
  t.cost.beta_s_per_byte = 1 / cluster.link_bytes_per_s;
  t.cost.gamma_s_per_byte = cluster.gamma_s_per_byte;
  t.native.clear();
  t.measured.clear();
  NetworkModel model(std::move(t));
  model._cluster = std::move(cluster);
  return model;
}

ClusterNetwork NetworkModel::cluster_at(int ranks) const {
  if (!_cluster) throw Error(ErrorCode::invalid_argument, "this network model has one level");
  if (ranks < 1)
    throw Error(ErrorCode::invalid_argument, "a cluster of " + std::to_string(ranks) + " ranks");
  if (ranks == _cluster->topology.world_size()) return *_cluster;
  const int per_node = static_cast<int>(_cluster->topology.ranks_of_node(0).size());
  return _cluster->on(Topology::blocks(ranks, per_node));
}

bool NetworkModel::allowed(Algorithm a) const {
  return _allowed.empty() || std::find(_allowed.begin(), _allowed.end(), a) != _allowed.end();
}

CollectiveCost NetworkModel::collective(Collective op, std::size_t bytes, int ranks) const {
  if (ranks <= 1) return {Algorithm::native, 0};
  auto none_allowed = [&] {
    std::string names;
    for (Algorithm a : _allowed) names += (names.empty() ? "" : ", ") + std::string(to_string(a));
    return Error(ErrorCode::invalid_argument, "none of the allowed algorithms (" + names +
                                                  ") applies to " + std::string(to_string(op)) +
                                                  " at " + std::to_string(ranks) + " ranks");
  };
  if (_cluster) {
    const ClusterNetwork at = cluster_at(ranks);
    CollectiveCost best{Algorithm::native, std::numeric_limits<double>::infinity()};
    for (Algorithm a : candidates(op)) {
      if (!allowed(a)) continue;
      const double s = cluster_cost(at, a, op, bytes).seconds;
      if (s < best.seconds) best = {a, s};
    }
    if (!std::isfinite(best.seconds)) {
      if (!_allowed.empty()) throw none_allowed();
      throw Error(ErrorCode::unsupported, "no two-level model for " + std::string(to_string(op)) +
                                              " (loom has no algorithm of its own for it)");
    }
    return best;
  }
  CollectiveCost best{Algorithm::native, std::numeric_limits<double>::infinity()};
  for (Algorithm a : candidates(op)) {
    if (a == Algorithm::native || !allowed(a)) continue;
    const double s = _selector.predict(a, op, bytes, ranks);
    if (s < best.seconds) best = {a, s};
  }
  // Without a fit native is modelled as the best formula: name that formula instead.
  if (allowed(Algorithm::native)) {
    const double native = _selector.predict(Algorithm::native, op, bytes, ranks);
    if (native < best.seconds) best = {Algorithm::native, native};
  }
  if (!std::isfinite(best.seconds)) {
    if (!_allowed.empty()) throw none_allowed();
    throw Error(ErrorCode::unsupported, "no cost model for " + std::string(to_string(op)) + " at " +
                                            std::to_string(ranks) + " ranks");
  }
  return best;
}

double NetworkModel::point_to_point(std::size_t bytes) const {
  if (_cluster)
    return _cluster->link_latency_s + static_cast<double>(bytes) / _cluster->link_bytes_per_s;
  return tuning().cost.alpha_s + static_cast<double>(bytes) * tuning().cost.beta_s_per_byte;
}

}  // namespace loom
