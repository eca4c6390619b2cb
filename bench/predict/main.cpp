// loom-predict: predicts a profiled step (loom-overlap --profile-json) at other rank counts and
// links, with the schedule the simulator finds best.
//   loom-predict step.loom.json --link 2gbit --latency 20us
//   loom-predict step.loom.json --ranks 8,64,1024 --link 100gbit --latency 5us
//   loom-predict step.loom.json --fit          (a wire calibrated on the profile itself)
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
                                                          "one JSON object per rank count");
  po::positional_options_description positional;
  positional.add("profile", 1);
  std::vector<int> ranks;
  std::optional<NetworkModel> network;
  StepProfile profile;
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
    if (flags.profile.empty()) throw Error(ErrorCode::invalid_argument, "no profile given");
    const int wires =
        !flags.link.empty() + !flags.tuning.empty() + flags.fit + !flags.fit_from.empty();
    if (wires != 1)
      throw Error(ErrorCode::invalid_argument,
                  "give the wire with exactly one of --link, "
                  "--tuning, --fit and --fit-from");
    profile = load_step_profile(flags.profile);
    ranks = parse_ranks(flags.ranks, profile.ranks);
    if (!(flags.compute_scale > 0))
      throw Error(ErrorCode::invalid_argument, "--compute-scale must be > 0");
    for (ProfiledNode& node : profile.nodes)
      if (node.kind == NodeKind::compute || node.kind == NodeKind::copy ||
          node.kind == NodeKind::external)
        node.duration_s *= flags.compute_scale;
    const double latency = parse_duration(flags.latency);
    if (!flags.link.empty())
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
    for (int r : ranks) {
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
