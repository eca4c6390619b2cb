// loom-predict: predicts a profiled step (loom-overlap --profile-json) at other rank counts and
// links, with the schedule the simulator finds best.
//   loom-predict step.loom.json --link 2gbit --latency 20us
//   loom-predict step.loom.json --ranks 8,64,1024 --link 100gbit --latency 5us
//   loom-predict step.loom.json --fit          (a wire calibrated on the profile itself)
//   loom-predict --nodes 2,16,128 --ranks-per-node 8 --link 100gbit --intra 200GB/s
//       --collective allreduce --sizes 1M,64M    (each algorithm on two levels, no profile)
//   loom-predict step.loom.json --nodes 128 --ranks-per-node 8 --link 100gbit --intra 200GB/s
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <boost/program_options.hpp>

#include "loom/error.hpp"
#include "loom/step_simulator.hpp"

namespace po = boost::program_options;
using namespace loom;

namespace {

struct Flags {
  std::string profile;
  std::string ranks;
  std::string link;
  std::string latency = "20us";
  std::string tuning;
  bool fit = false;
  std::string fit_from;
  int workers = 0;
  int in_flight = -1;
  double cores = 0;
  double comm_cpu = 0;
  double compute_scale = 1;
  bool best = true;
  bool json = false;
  // Two levels (--nodes, --ranks-per-node, --intra).
  std::string nodes;
  std::string ranks_per_node;
  std::string intra;
  std::string intra_latency = "1us";
  std::string gamma;
  std::string collective;
  std::string sizes;
  std::string algorithms;  // --algorithms: only these of loom's (empty: all)
};

std::vector<int> parse_ranks(const std::string& text, int fallback) {
  if (text.empty()) return {fallback};
  std::vector<int> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      std::size_t used = 0;
      const int r = std::stoi(item, &used);
      if (used != item.size() || r < 1) throw std::invalid_argument(item);
      out.push_back(r);
    } catch (const std::exception&) {
      throw Error(ErrorCode::invalid_argument, "--ranks: '" + item + "' is not a rank count >= 1");
    }
  }
  return out;
}

// "4M", "64K", "1G" (powers of 1024), "100" bytes.
std::vector<std::size_t> parse_sizes(const std::string& text) {
  std::vector<std::size_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    std::size_t used = 0, value = 0;
    try {
      value = std::stoull(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    std::size_t scale = 1;
    const std::string unit = used > 0 ? item.substr(used) : "";
    if (unit == "K" || unit == "k") scale = std::size_t{1} << 10;
    if (unit == "M" || unit == "m") scale = std::size_t{1} << 20;
    if (unit == "G" || unit == "g") scale = std::size_t{1} << 30;
    if (used == 0 || value == 0 || (scale == 1 && !unit.empty()))
      throw Error(ErrorCode::invalid_argument,
                  "--sizes: '" + item + "' is not a size in bytes like 8, 64K, 16M or 1G");
    out.push_back(value * scale);
  }
  if (out.empty()) throw Error(ErrorCode::invalid_argument, "--sizes: no size given");
  return out;
}

// --nodes N[,N...] and --ranks-per-node L (or one count per node: 2,1,3): the clusters asked
// about, with the rates of --link, --latency, --intra, --intra-latency and --gamma.
std::vector<ClusterNetwork> parse_clusters(const Flags& f) {
  if (f.ranks_per_node.empty() || f.link.empty() || f.intra.empty())
    throw Error(ErrorCode::invalid_argument,
                "two levels need --ranks-per-node, --link (each node's link) and --intra (a "
                "node's memory, e.g. 200GB/s)");
  const double link = parse_link_rate(f.link);
  const double intra = parse_byte_rate(f.intra);
  const double latency = parse_duration(f.latency);
  const double intra_latency = parse_duration(f.intra_latency);
  const double gamma =
      f.gamma.empty() ? default_tuning().cost.gamma_s_per_byte : parse_duration(f.gamma);
  std::vector<int> per_node = parse_ranks(f.ranks_per_node, 0);
  std::vector<ClusterNetwork> out;
  if (per_node.size() > 1) {
    if (!f.nodes.empty() && parse_ranks(f.nodes, 0) != std::vector<int>{int(per_node.size())})
      throw Error(ErrorCode::invalid_argument, "--ranks-per-node '" + f.ranks_per_node +
                                                   "' gives " + std::to_string(per_node.size()) +
                                                   " nodes, --nodes says '" + f.nodes + "'");
    std::vector<int> ids;
    for (std::size_t node = 0; node < per_node.size(); ++node)
      ids.insert(ids.end(), per_node[node], static_cast<int>(node));
    out.push_back(ClusterNetwork::uniform(1, 1, link, intra, latency, intra_latency, gamma)
                      .on(Topology::from_node_ids(ids)));
    return out;
  }
  if (f.nodes.empty()) throw Error(ErrorCode::invalid_argument, "two levels need --nodes");
  for (int n : parse_ranks(f.nodes, 0))
    out.push_back(
        ClusterNetwork::uniform(n, per_node[0], link, intra, latency, intra_latency, gamma));
  return out;
}

std::string placement(const Topology& t) {
  std::string text;
  if (t.uniform())
    return std::to_string(t.node_count()) + "x" + std::to_string(t.ranks_of_node(0).size());
  for (int n = 0; n < t.node_count(); ++n)
    text += (n ? "+" : "") + std::to_string(t.ranks_of_node(n).size());
  return text;
}

// Each of `collective`'s algorithms on each cluster at each size: ms, and x the link bound for
// allreduce.
int collective_table(const std::vector<ClusterNetwork>& clusters, Collective collective,
                     const std::vector<std::size_t>& sizes, bool json,
                     const std::vector<Algorithm>& allowed) {
  std::vector<Algorithm> algorithms;
  for (Algorithm a : candidates(collective))
    if (a != Algorithm::native &&
        (allowed.empty() || std::find(allowed.begin(), allowed.end(), a) != allowed.end()))
      algorithms.push_back(a);
  if (algorithms.empty())
    throw Error(ErrorCode::invalid_argument,
                "loom has no algorithm of its own for " + std::string(to_string(collective)));
  const ClusterNetwork& first = clusters.front();
  if (!json) {
    std::printf(
        "# loom-predict: %s on two levels: link %.3f Gbit/s each way per node, alpha %.2f us; "
        "a node's memory %.3f GB/s, alpha %.2f us; gamma %.3f ns/B. ms (x the link bound)\n",
        std::string(to_string(collective)).c_str(), first.link_bytes_per_s * 8e-9,
        first.link_latency_s * 1e6, first.intra_bytes_per_s * 1e-9, first.intra_latency_s * 1e6,
        first.gamma_s_per_byte * 1e9);
    std::printf("# %-9s %6s %10s %10s", "nodes", "ranks", "bytes", "bound_ms");
    for (Algorithm a : algorithms) std::printf(" %20s", std::string(to_string(a)).c_str());
    std::printf(" %-12s\n", "best");
  }
  for (const ClusterNetwork& c : clusters)
    for (std::size_t bytes : sizes) {
      const double bound =
          collective == Collective::allreduce ? allreduce_link_bound(c, bytes) : 0.0;
      Algorithm best = algorithms.front();
      double best_s = INFINITY;
      std::string cells, fields;
      for (Algorithm a : algorithms) {
        const ClusterCost cost = cluster_cost(c, a, collective, bytes);
        const std::string name(to_string(a));
        char cell[64];
        if (!std::isfinite(cost.seconds)) {
          std::snprintf(cell, sizeof cell, " %20s", "-");
        } else if (bound > 0) {
          std::snprintf(cell, sizeof cell, " %11.3f (%5.2fx)", cost.seconds * 1e3,
                        cost.seconds / bound);
        } else {
          std::snprintf(cell, sizeof cell, " %20.3f", cost.seconds * 1e3);
        }
        cells += cell;
        if (std::isfinite(cost.seconds)) {
          fields += ", \"" + name + "_ms\": " + std::to_string(cost.seconds * 1e3) + ", \"" + name +
                    "_link_bytes\": " + std::to_string(cost.link_bytes);
          if (cost.seconds < best_s) {
            best_s = cost.seconds;
            best = a;
          }
        }
      }
      if (json)
        std::printf(
            "{\"placement\": \"%s\", \"ranks\": %d, \"bytes\": %zu, \"bound_ms\": %.6f%s, "
            "\"best\": \"%s\"}\n",
            placement(c.topology).c_str(), c.topology.world_size(), bytes, bound * 1e3,
            fields.c_str(), std::string(to_string(best)).c_str());
      else
        std::printf("  %-9s %6d %10zu %10.3f%s %-12s\n", placement(c.topology).c_str(),
                    c.topology.world_size(), bytes, bound * 1e3, cells.c_str(),
                    std::string(to_string(best)).c_str());
    }
  return 0;
}

// The largest collective's algorithm names the row (the one that dominates the wire).
std::string main_algorithm(const StepProfile& p, const Prediction& r) {
  std::size_t best = p.nodes.size(), bytes = 0;
  for (std::size_t id = 0; id < p.nodes.size(); ++id)
    if (p.nodes[id].kind == NodeKind::collective && p.nodes[id].bytes >= bytes) {
      best = id;
      bytes = p.nodes[id].bytes;
    }
  return best < p.nodes.size() && !r.nodes[best].algorithm.empty() ? r.nodes[best].algorithm : "-";
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  po::options_description options("loom-predict options");
  options.add_options()("help,h", "this help")("profile", po::value(&flags.profile),
                                               "the step profile (loom-overlap --profile-json)")(
      "ranks", po::value(&flags.ranks), "comma-separated rank counts (default: the profile's)")(
      "link", po::value(&flags.link), "the wire: a rate (2gbit, 100gbit, 10gbps)")(
      "latency", po::value(&flags.latency)->default_value(flags.latency),
      "alpha, per message (20us, 1.5ms)")(
      "tuning", po::value(&flags.tuning),
      "the wire from a tuning file (loom-tune's alpha/beta/gamma)")(
      "fit", po::bool_switch(&flags.fit),
      "the wire fitted to the profile's measured communication time (with --latency)")(
      "fit-from", po::value(&flags.fit_from),
      "the wire fitted to another profile's measured communication (e.g. sequential mode's "
      "of the same run, to predict the overlapped modes)")(
      "workers", po::value(&flags.workers)->default_value(0),
      "compute workers per rank (0: the profile's)")(
      "in-flight", po::value(&flags.in_flight)->default_value(-1),
      "collectives in flight (-1: the profile's, 0: no limit)")(
      "cores", po::value(&flags.cores)->default_value(0),
      "cores per rank, in the profile's units (0: --workers; see --comm-cpu)")(
      "comm-cpu", po::value(&flags.comm_cpu)->default_value(0),
      "cores the transport needs while on the wire; compute and the wire slow when the demand "
      "exceeds --cores (0: no contention)")(
      "compute-scale", po::value(&flags.compute_scale)->default_value(1),
      "multiply every compute and copy duration (what if compute were 10x faster: 0.1)")(
      "no-best", "skip the search for the best schedule")("json", po::bool_switch(&flags.json),
                                                          "one JSON object per rank count")(
      "nodes", po::value(&flags.nodes),
      "two levels: comma-separated node counts (with --ranks-per-node, --link, --intra)")(
      "ranks-per-node", po::value(&flags.ranks_per_node),
      "ranks on each node, or one count per node (2,1,3: uneven, 3 nodes)")(
      "intra", po::value(&flags.intra),
      "a node's memory, shared by its ranks' messages (200GB/s, 5GB/s, 400gbit)")(
      "intra-latency", po::value(&flags.intra_latency)->default_value(flags.intra_latency),
      "alpha of a message inside a node (--latency is the link's)")(
      "gamma", po::value(&flags.gamma),
      "seconds per byte reduced (0.25ns; default: the built-in tuning's)")(
      "collective", po::value(&flags.collective),
      "no profile: each algorithm of this collective (allreduce, allgather, ...) on the "
      "clusters, at --sizes")("sizes", po::value(&flags.sizes),
                              "with --collective: comma-separated sizes (4M,64M)")(
      "algorithms", po::value(&flags.algorithms),
      "each collective only by one of these (ring,rd,rabenseifner,tree,hierarchical,native): "
      "what the step would be with flat algorithms only, say");
  po::positional_options_description positional;
  positional.add("profile", 1);
  std::vector<int> ranks;
  std::optional<NetworkModel> network;
  StepProfile profile;
  std::vector<ClusterNetwork> clusters;
  std::vector<Algorithm> allowed;
  try {
    po::variables_map vm;
    po::store(po::command_line_parser(argc, argv).options(options).positional(positional).run(),
              vm);
    if (vm.count("help")) {
      std::cout << "usage: loom-predict PROFILE.json [options]\n" << options << "\n";
      return 0;
    }
    po::notify(vm);
    flags.best = vm.count("no-best") == 0;
    const bool two_levels = !flags.nodes.empty() || !flags.ranks_per_node.empty();
    if (!flags.algorithms.empty()) {
      std::stringstream in(flags.algorithms);
      std::string name;
      while (std::getline(in, name, ',')) allowed.push_back(parse_algorithm(name));
    }
    if (two_levels) clusters = parse_clusters(flags);
    if (!flags.collective.empty()) {
      if (!two_levels)
        throw Error(ErrorCode::invalid_argument,
                    "--collective needs a cluster: --nodes, --ranks-per-node, --link, --intra");
      if (!flags.profile.empty())
        throw Error(ErrorCode::invalid_argument, "give a profile or --collective, not both");
      Collective op = Collective::allreduce;
      bool known = false;
      for (Collective c : {Collective::allreduce, Collective::allgather, Collective::reduce_scatter,
                           Collective::broadcast, Collective::reduce})
        if (flags.collective == to_string(c)) {
          op = c;
          known = true;
        }
      if (!known)
        throw Error(ErrorCode::invalid_argument,
                    "--collective: unknown '" + flags.collective +
                        "' (allreduce, allgather, reduce_scatter, broadcast or reduce)");
      return collective_table(clusters, op, parse_sizes(flags.sizes.empty() ? "1M" : flags.sizes),
                              flags.json, allowed);
    }
    if (flags.profile.empty()) throw Error(ErrorCode::invalid_argument, "no profile given");
    const int wires =
        !flags.link.empty() + !flags.tuning.empty() + flags.fit + !flags.fit_from.empty();
    if (two_levels &&
        (!flags.tuning.empty() || flags.fit || !flags.fit_from.empty() || !flags.ranks.empty()))
      throw Error(ErrorCode::invalid_argument,
                  "two levels take --link and --intra (not --tuning, --fit, --fit-from) and "
                  "the rank counts from --nodes x --ranks-per-node (not --ranks)");
    if (wires != 1)
      throw Error(ErrorCode::invalid_argument,
                  "give the wire with exactly one of --link, "
                  "--tuning, --fit and --fit-from");
    profile = load_step_profile(flags.profile);
    ranks = parse_ranks(flags.ranks, profile.ranks);
    if (two_levels) {
      ranks.clear();
      for (const ClusterNetwork& c : clusters) ranks.push_back(c.topology.world_size());
    }
    if (!(flags.compute_scale > 0))
      throw Error(ErrorCode::invalid_argument, "--compute-scale must be > 0");
    for (ProfiledNode& node : profile.nodes)
      if (node.kind == NodeKind::compute || node.kind == NodeKind::copy ||
          node.kind == NodeKind::external)
        node.duration_s *= flags.compute_scale;
    const double latency = parse_duration(flags.latency);
    if (two_levels)
      network.reset();
    else if (!flags.link.empty())
      network = NetworkModel::from_link(parse_link_rate(flags.link), latency);
    else if (!flags.tuning.empty())
      network = NetworkModel(load_tuning_file(flags.tuning));
    else if (flags.fit)
      network = NetworkModel::fitted(profile, latency);
    else
      network = NetworkModel::fitted(load_step_profile(flags.fit_from), latency);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom-predict: %s\n", e.what());
    return 2;
  }
  try {
    if (!network) network = NetworkModel::two_level(clusters.front());
    network->allow_only(allowed);
    const double beta = network->tuning().cost.beta_s_per_byte;
    if (!flags.json)
      std::printf(
          "# loom-predict: %s (%s, measured at %d ranks: step %.3f ms); wire alpha %.2f "
          "us, %.3f Gbit/s, gamma %.3f ns/B; %d workers; compute x %g\n",
          profile.label.c_str(), flags.profile.c_str(), profile.ranks,
          profile.measured_step_s * 1e3, network->tuning().cost.alpha_s * 1e6,
          beta > 0 ? 8e-9 / beta : 0.0, network->tuning().cost.gamma_s_per_byte * 1e9,
          flags.workers > 0 ? flags.workers : profile.workers, flags.compute_scale);
    if (!flags.json)
      std::printf("# %6s %-12s %9s %10s %9s %9s %10s %9s %9s %8s %10s %s\n", "ranks", "algorithm",
                  "step_ms", "compute_ms", "comm_ms", "hidden_ms", "exposed_ms", "overlap",
                  "critical", "best_ms", "step/best", "best schedule");
    if (!clusters.empty() && !flags.json)
      std::printf(
          "# two levels: a node's memory %.3f GB/s, alpha %.2f us; the wire above is "
          "each node's link\n",
          clusters.front().intra_bytes_per_s * 1e-9, clusters.front().intra_latency_s * 1e6);
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      const int r = ranks[i];
      if (!clusters.empty()) {
        network = NetworkModel::two_level(clusters[i]);
        network->allow_only(allowed);
      }
      SimulationOptions sim;
      sim.ranks = r;
      sim.workers = flags.workers > 0 ? flags.workers : profile.workers;
      sim.cores = flags.cores;
      sim.comm_cpu = flags.comm_cpu;
      sim.collectives_in_flight = flags.in_flight >= 0 ? static_cast<std::size_t>(flags.in_flight)
                                                       : profile.collectives_in_flight;
      const Prediction p = simulate(profile, *network, sim);
      std::optional<Schedule> best;
      if (flags.best) best = best_schedule(profile, *network, sim);
      const Prediction& b = best ? best->prediction : p;
      std::string plan = "-";
      if (best) {
        const bool same_order = best->options.issue_order == default_issue_order(profile);
        plan = "in-flight " + std::to_string(best->options.collectives_in_flight) +
               (same_order ? ", same order" : ", reordered");
      }
      const double overlap = p.comm_s > 0 ? p.hidden_s / p.comm_s : 0;
      if (flags.json) {
        std::printf(
            "{\"ranks\": %d, \"algorithm\": \"%s\", \"step_ms\": %.6f, \"compute_ms\": "
            "%.6f, \"comm_ms\": %.6f, \"hidden_ms\": %.6f, \"exposed_ms\": %.6f, "
            "\"critical_path_ms\": %.6f, \"best_ms\": %.6f, \"best_in_flight\": %zu, "
            "\"measured_ms\": %.6f}\n",
            r, main_algorithm(profile, p).c_str(), p.step_s * 1e3, p.compute_s * 1e3,
            p.comm_s * 1e3, p.hidden_s * 1e3, p.exposed_s * 1e3, p.critical_path_s * 1e3,
            b.step_s * 1e3, best ? best->options.collectives_in_flight : 0,
            r == profile.ranks ? profile.measured_step_s * 1e3 : 0.0);
      } else {
        std::printf("  %6d %-12s %9.3f %10.3f %9.3f %9.3f %10.3f %9.3f %9.3f %8.3f %10.3f %s\n", r,
                    main_algorithm(profile, p).c_str(), p.step_s * 1e3, p.compute_s * 1e3,
                    p.comm_s * 1e3, p.hidden_s * 1e3, p.exposed_s * 1e3, overlap,
                    p.critical_path_s * 1e3, b.step_s * 1e3, p.step_s / b.step_s, plan.c_str());
      }
    }
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "loom-predict: %s\n", e.what());
    return 1;
  }
}
