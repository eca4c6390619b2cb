// AlgorithmSelector: the cost formulas, measured-table lookup, env overrides and fallback.
#include "loom/algorithm_selector.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "algorithms.hpp"
#include "ceil_log2.hpp"
#include "loom/environment.hpp"
#include "loom/error.hpp"
#include "stepwise_algorithm.hpp"

namespace loom {

std::string override_variable(Collective collective) {
  std::string name = "LOOM_";
  for (char c : to_string(collective)) name += static_cast<char>(std::toupper(c));
  return name;
}

std::size_t selection_bytes(const CollectiveArgs& args) noexcept {
  return args.op == Collective::allgather ? args.recv.bytes() : args.send.bytes();
}

AlgorithmSelector::AlgorithmSelector() : _tuning(default_tuning()), _defaults(true) {}

AlgorithmSelector::AlgorithmSelector(TuningParameters tuning)
    : _tuning(std::move(tuning)), _defaults(false) {
  index_measurements();
}

void AlgorithmSelector::index_measurements() {
  _measured.clear();
  for (const Measurement& m : _tuning.measured)
    for (TimingForm form : {TimingForm::blocking, TimingForm::asynchronous}) {
      if (m.form != TimingForm::unknown && m.form != form) continue;  // unknown: both tables
      const MeasuredKey key{m.collective, m.world, form};
      auto group = std::find_if(_measured.begin(), _measured.end(),
                                [&](const auto& g) { return g.first == key; });
      if (group == _measured.end()) group = _measured.insert(_measured.end(), {key, {}});
      auto& sizes = group->second;
      auto at = std::lower_bound(sizes.begin(), sizes.end(), m.bytes,
                                 [](const MeasuredSize& s, std::size_t b) { return s.bytes < b; });
      if (at == sizes.end() || at->bytes != m.bytes) {
        at = sizes.insert(at, MeasuredSize{m.bytes, {}});
      }
      auto same =
          std::find_if(at->algorithms.begin(), at->algorithms.end(),
                       [&](const MeasuredAlgorithm& a) { return a.algorithm == m.algorithm; });
      if (same == at->algorithms.end())
        at->algorithms.push_back({m.algorithm, m.seconds, m.spread_seconds});
      else
        *same = {m.algorithm, m.seconds, m.spread_seconds};
    }
}

namespace {

void say_defaults_once(const CostParameters& c) {
  static std::once_flag said;
  std::call_once(said, [&] {
    std::fprintf(stderr,
                 "loom: no LOOM_TUNING_FILE; the algorithm selector uses its defaults (alpha "
                 "%.3g us, beta %.3g ns/B, gamma %.3g ns/B); run loom-tune to measure them\n",
                 c.alpha_s * 1e6, c.beta_s_per_byte * 1e9, c.gamma_s_per_byte * 1e9);
  });
}

}  // namespace

void AlgorithmSelector::read_overrides() {
  for (Collective c : {Collective::allreduce, Collective::allgather, Collective::reduce_scatter,
                       Collective::broadcast, Collective::reduce}) {
    const std::string variable = override_variable(c);
    const auto value = environment::text(variable);
    if (!value) continue;
    try {
      set_override(c, parse_algorithm_ranges(*value));
    } catch (const Error& e) {
      throw Error(ErrorCode::invalid_argument, variable + ": " + e.message());
    }
  }
}

AlgorithmSelector AlgorithmSelector::from_environment() {
  AlgorithmSelector selector;
  if (const auto path = environment::text("LOOM_TUNING_FILE"))
    selector = AlgorithmSelector(load_tuning_file(*path));
  else
    say_defaults_once(selector._tuning.cost);
  selector.read_overrides();
  return selector;
}

namespace {

// How a rank makes its selector, as one number the ranks compare: -1 an environment it could
// not read, 0 LOOM_TUNING_FILE, 1 no calibration, 2 + a bit per collective calibrated.
std::int64_t selector_source(bool tuning_file, bool invalid,
                             const std::optional<CalibrationOptions>& calibration) {
  if (invalid) return -1;
  if (tuning_file) return 0;
  std::int64_t bits = 0;
  if (calibration)
    for (Collective c : calibration->collectives) bits |= std::int64_t{1} << static_cast<int>(c);
  return bits == 0 ? 1 : 2 + bits;
}

std::string describe_source(std::int64_t source) {
  if (source == -1)
    return "a malformed LOOM_TUNING_FILE, LOOM_CALIBRATION or LOOM_<COLLECTIVE> (its own error "
           "names it)";
  if (source == 0) return "LOOM_TUNING_FILE, no calibration";
  if (source == 1) return "no calibration (LOOM_CALIBRATION=0)";
  std::string names;
  const std::int64_t bits = source - 2;
  for (int c = 0; c <= static_cast<int>(Collective::barrier); ++c)
    if (bits & (std::int64_t{1} << c))
      names += (names.empty() ? "" : ",") + std::string(to_string(static_cast<Collective>(c)));
  return "calibrates " + names;
}

// Every rank's source, gathered: a rank that calibrates times candidates with the others, so
// ranks that disagree (one with LOOM_CALIBRATION=0 or LOOM_TUNING_FILE) would wait for each
// other until the watchdog. Throws ErrorCode::mismatch on every rank instead, naming each
// rank's source (the rank whose environment is malformed throws its own error).
void agree_on_source(Backend& backend, std::int64_t mine, const std::exception_ptr& own_error,
                     std::chrono::nanoseconds limit) {
  const int world = backend.world_size();
  const std::vector<std::int64_t> all =
      backend.exchange_int64("selector agreement", std::span(&mine, 1), limit, [&] {
        return "the check that every rank makes its algorithm selector alike (rank " +
               std::to_string(backend.rank()) + " of " + std::to_string(world) + ")";
      });
  if (own_error) std::rethrow_exception(own_error);
  if (std::all_of(all.begin(), all.end(), [&](std::int64_t s) { return s == all.front(); })) return;
  std::string message =
      "the ranks disagree on how the algorithm selector is made (LOOM_TUNING_FILE, "
      "LOOM_CALIBRATION): ";
  std::vector<bool> said(all.size(), false);
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (said[r]) continue;
    std::string ranks;
    int count = 0;
    for (std::size_t q = r; q < all.size(); ++q)
      if (all[q] == all[r]) {
        said[q] = true;
        ranks += (count++ ? ", " : "") + std::to_string(q);
      }
    message += (r ? "; " : "") + std::string(count > 1 ? "ranks " : "rank ") + ranks + ": " +
               describe_source(all[r]);
  }
  throw Error(ErrorCode::mismatch, message + " (this is rank " + std::to_string(backend.rank()) +
                                       " of " + std::to_string(world) + ")");
}

}  // namespace

AlgorithmSelector AlgorithmSelector::for_backend(Backend& backend,
                                                 std::optional<CalibrationOptions> calibration,
                                                 std::optional<std::chrono::nanoseconds> timeout) {
  // Backends between processes with an algorithm channel calibrate (mpi, ucx): the local
  // backend's ranks are threads whose timings say little about a job, and nccl's collectives
  // are all native.
  const bool may_calibrate =
      backend.name() != "local" && backend.world_size() > 1 && backend.has_algorithm_channel();
  const auto tuning_path = environment::text("LOOM_TUNING_FILE");
  const bool applies = may_calibrate && !tuning_path;
  // What this rank can check alone (the tuning file, the LOOM_<COLLECTIVE> overrides,
  // LOOM_CALIBRATION) before the exchange, so that a malformed one is told to the other ranks
  // there instead of leaving them waiting for this one later.
  std::exception_ptr invalid;
  std::optional<AlgorithmSelector> uncalibrated;  // the tuning file's or the model's
  try {
    if (applies && !calibration) calibration = CalibrationOptions::from_environment();
    if (!applies || !calibration || calibration->collectives.empty())
      uncalibrated = from_environment();
    else
      AlgorithmSelector().read_overrides();  // checked now, applied after the calibration
  } catch (const Error&) {
    invalid = std::current_exception();
  }
  if (may_calibrate)
    agree_on_source(backend,
                    selector_source(tuning_path.has_value(), invalid != nullptr, calibration),
                    invalid, timeout.value_or(backend.timeout()));
  else if (invalid)
    std::rethrow_exception(invalid);
  if (uncalibrated) return std::move(*uncalibrated);
  const Calibration measured = calibrate(backend, *calibration);
  TuningParameters tuning = default_tuning();
  tuning.backend = std::string(backend.name());
  tuning.measured = measured.measured;
  AlgorithmSelector selector(std::move(tuning));
  for (const CalibrationReport& r : measured.reports)
    selector._calibration += (selector._calibration.empty() ? "" : ", ") + r.path;
  selector.read_overrides();
  return selector;
}

std::uint64_t AlgorithmSelector::digest() const {
  // FNV-1a over a canonical text of the configuration.
  std::string text = _defaults ? std::string("defaults") : format_tuning_file(_tuning);
  for (std::size_t c = 0; c < _overrides.size(); ++c)
    for (const AlgorithmRange& r : _overrides[c])
      text += "\noverride " + std::to_string(c) + " " + std::string(to_string(r.algorithm)) + " " +
              std::to_string(r.min_bytes) + " " + std::to_string(r.max_bytes);
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : text) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

std::string AlgorithmSelector::origin() const {
  std::string text = _defaults               ? std::string("built-in defaults")
                     : !_calibration.empty() ? "a calibration (" + _calibration + ")"
                                             : "a tuning file (backend " + _tuning.backend + ")";
  for (std::size_t c = 0; c < _overrides.size(); ++c)
    if (!_overrides[c].empty()) text += ", " + override_variable(static_cast<Collective>(c));
  return text;
}

void AlgorithmSelector::set_override(Collective collective, std::vector<AlgorithmRange> ranges) {
  for (const AlgorithmRange& r : ranges) {
    bool implements = false;
    for (Algorithm a : candidates(collective)) implements = implements || a == r.algorithm;
    if (!implements)
      throw Error(
          ErrorCode::invalid_argument,
          std::string(to_string(r.algorithm)) + " does not implement " +
              std::string(to_string(collective)) + " (candidates: " +
              [&] {
                std::string list;
                for (Algorithm a : candidates(collective))
                  list += (list.empty() ? "" : ", ") + std::string(to_string(a));
                return list;
              }() +
              ")");
  }
  _overrides[static_cast<std::size_t>(collective)] = std::move(ranges);
}

namespace {

// The topology of `world` ranks on one node, made once per thread and world size.
const Topology& flat_topology(int world) {
  thread_local std::vector<std::pair<int, std::unique_ptr<const Topology>>> made;
  for (const auto& [w, t] : made)
    if (w == world) return *t;
  return *made.emplace_back(world, std::make_unique<const Topology>(Topology::single_node(world)))
              .second;
}

}  // namespace

// The selector's reading of a schedule (Thakur, Rabenseifner & Gropp's alpha-beta-gamma model):
// within a part, a rank pays alpha per message piece and beta per byte for what it sends and,
// apart, for what it receives, the slower of the two; a message between nodes instead loads
// its nodes' links (alpha once, beta on the most bytes a link carries one way, at the inter
// level). A step lasts as long as its slowest part, then its reduction (gamma per byte) and
// its local copies (a quarter of gamma per byte: one read and one write, against a
// reduction's two reads and a write over arithmetic), `repeat` times over.
double AlgorithmSelector::schedule_seconds(Algorithm algorithm, Collective collective,
                                           std::size_t bytes, const Topology& topology,
                                           const CostParameters& intra,
                                           const CostParameters& inter) {
  const AlgorithmInfo* row = find_algorithm(algorithm);
  const AlgorithmImplementation* run = row != nullptr ? row->implementation(collective) : nullptr;
  if (run == nullptr || run->schedule == nullptr) return std::numeric_limits<double>::infinity();
  thread_local MessageSchedule schedule;
  thread_local std::vector<double> sent, received, out, in;
  schedule.clear();
  if (!run->schedule(topology, static_cast<double>(bytes), schedule))
    return std::numeric_limits<double>::infinity();
  const auto ranks = static_cast<std::size_t>(topology.world_size());
  const auto nodes = static_cast<std::size_t>(topology.node_count());
  double total = 0;
  for (const MessageSchedule::Step& step : schedule.steps()) {
    double slowest = 0;
    for (const MessageSchedule::Part& part : schedule.parts(step)) {
      sent.assign(ranks, 0.0);
      received.assign(ranks, 0.0);
      out.assign(nodes, 0.0);
      in.assign(nodes, 0.0);
      bool crosses = false;
      for (const ScheduledMessage& m : schedule.messages(part)) {
        const int a = topology.node_of(m.from), b = topology.node_of(m.to);
        if (a == b) {
          const double t = m.pieces * intra.alpha_s + m.bytes * intra.beta_s_per_byte;
          sent[static_cast<std::size_t>(m.from)] += t;
          received[static_cast<std::size_t>(m.to)] += t;
        } else {
          out[static_cast<std::size_t>(a)] += m.bytes;
          in[static_cast<std::size_t>(b)] += m.bytes;
          crosses = true;
        }
      }
      double part_s = 0;
      for (std::size_t r = 0; r < ranks; ++r) part_s = std::max({part_s, sent[r], received[r]});
      if (crosses) {
        double link = 0;
        for (std::size_t n = 0; n < nodes; ++n) link = std::max({link, out[n], in[n]});
        part_s = std::max(part_s, inter.alpha_s + link * inter.beta_s_per_byte);
      }
      slowest = std::max(slowest, part_s);
    }
    total += step.repeat * (slowest + step.reduced * intra.gamma_s_per_byte +
                            step.copied * intra.gamma_s_per_byte / 4);
  }
  return total;
}

// Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication Operations in
// MPICH" (2005), with the fold for non-power-of-two rank counts; n in bytes.
double AlgorithmSelector::predict(Algorithm algorithm, Collective collective, std::size_t bytes,
                                  int world) const {
  return predict_with(_tuning.cost, algorithm, collective, bytes, world);
}

namespace {

// Whether `topology` has the two levels hierarchical allreduce exploits: several nodes, some
// of them with several ranks. Elsewhere every prediction is the flat, one-level model's.
bool two_levels(const Topology& t) {
  return t.node_count() >= 2 && t.node_count() < t.world_size();
}

}  // namespace

double AlgorithmSelector::predict(Algorithm algorithm, Collective collective, std::size_t bytes,
                                  const Topology& topology) const {
  const int world = topology.world_size();
  if (!two_levels(topology)) return predict(algorithm, collective, bytes, world);
  // The inter-node level: measured (TuningParameters::inter_node), else modelled as the
  // intra-node one with beta inter_node_beta_factor times higher.
  CostParameters inter = _tuning.cost;
  if (_tuning.inter_node) {
    inter.alpha_s = _tuning.inter_node->alpha_s;
    inter.beta_s_per_byte = _tuning.inter_node->beta_s_per_byte;
  } else {
    inter.beta_s_per_byte *= inter_node_beta_factor;
  }
  const AlgorithmInfo* row = find_algorithm(algorithm);
  if (row == nullptr || !row->follows_topology)
    return predict_with(inter, algorithm, collective, bytes, world);
  // An algorithm that follows the nodes (hierarchical): its schedule on the topology, messages
  // inside a node at the tuning's alpha and beta, those between nodes at the inter-node
  // level's, sharing their node's link.
  return schedule_seconds(algorithm, collective, bytes, topology, _tuning.cost, inter);
}

double AlgorithmSelector::predict_with(const CostParameters& cost, Algorithm algorithm,
                                       Collective collective, std::size_t bytes, int world) const {
  const double n = static_cast<double>(bytes);
  if (world <= 1) return 0;
  if (algorithm == Algorithm::native) {
    for (const NativeFit& f : _tuning.native)
      if (f.collective == collective && f.world == world) return f.alpha_s + n * f.beta_s_per_byte;
    // No fit: the library is assumed to run the best of the same algorithms, minus loom's
    // per-message overhead, which alpha includes; for allreduce, the best of the latency-optimal
    // ones only (no row marked bandwidth_optimal). Measured (Open MPI 4.1, vader, 2 ranks):
    // MPI_Allreduce and MPI_Iallreduce take 2-3x loom's ring and Rabenseifner from 4 MiB up, as a
    // library moving the whole buffer per step does, so an untuned model that let native tie with
    // the bandwidth-optimal algorithms (and win the tie) chose the slowest candidate for every
    // large allreduce. loom-tune's fit replaces this. A reduce-scatter has no such candidate to
    // leave out: measured (Open MPI 4.1.4, 2 ranks, 67 MB of float32), MPI_Reduce_scatter_block
    // takes 5x loom's ring on vader (58.6 against 11.7 ms) and 1.5x over TCP at 2 Gbit/s (403
    // against 265 ms), as a reduction of the whole buffer followed by its scatter does: untuned,
    // it is modelled as moving the whole buffer per step (the fallback below).
    double best = std::numeric_limits<double>::infinity();
    for (Algorithm c : candidates(collective)) {
      if (collective == Collective::reduce_scatter) break;
      if (c == Algorithm::native) continue;
      if (collective == Collective::allreduce && find_algorithm(c)->bandwidth_optimal) continue;
      best = std::min(best, predict_with(cost, c, collective, bytes, world));
    }
    if (collective == Collective::reduce_scatter)  // the whole buffer reduced and sent per step
      return ceil_log2(world) * (cost.alpha_s + n * (cost.beta_s_per_byte + cost.gamma_s_per_byte));
    return std::isfinite(best) ? best : ceil_log2(world) * cost.alpha_s + n * cost.beta_s_per_byte;
  }
  return schedule_seconds(algorithm, collective, bytes, flat_topology(world), cost, cost);
}

// The time of `algorithm` at `bytes` from loom-tune's table, with its spread. Between two
// measured sizes the time is interpolated linearly in log(time) over log(bytes) (times grow as
// a power of the size between latency- and bandwidth-bound regimes, so a straight line on
// log-log axes follows them more closely than one on linear axes), and the spread keeps the
// interpolated fraction of the time; at a measured size it is that measurement; off the ends
// of the table, or where one neighbour lacks this algorithm, the nearest measurement within a
// factor of two. Otherwise nothing: the model decides.
std::optional<AlgorithmSelector::MeasuredTime> AlgorithmSelector::measured(Algorithm algorithm,
                                                                           Collective collective,
                                                                           std::size_t bytes,
                                                                           int world,
                                                                           TimingForm form) const {
  // The table of the call's form; a file timed in one form only (loom-tune without or with
  // --async) serves both.
  auto find = [&](TimingForm f) {
    const MeasuredKey key{collective, world, f};
    return std::find_if(_measured.begin(), _measured.end(),
                        [&](const auto& g) { return g.first == key; });
  };
  auto group = find(form);
  if (group == _measured.end())
    group = find(form == TimingForm::blocking ? TimingForm::asynchronous : TimingForm::blocking);
  if (group == _measured.end() || group->second.empty()) return std::nullopt;
  const auto& sizes = group->second;
  auto at = std::lower_bound(sizes.begin(), sizes.end(), bytes,
                             [](const MeasuredSize& s, std::size_t b) { return s.bytes < b; });
  auto time_at = [&](const MeasuredSize* s) -> std::optional<MeasuredTime> {
    if (s == nullptr) return std::nullopt;
    for (const MeasuredAlgorithm& a : s->algorithms)
      if (a.algorithm == algorithm && a.seconds >= 0)
        return MeasuredTime{a.seconds, a.spread_seconds};
    return std::nullopt;
  };
  if (at != sizes.end() && at->bytes == bytes) return time_at(&*at);
  const MeasuredSize* above = at == sizes.end() ? nullptr : &*at;
  const MeasuredSize* below = at == sizes.begin() ? nullptr : &*(at - 1);
  const double x = std::log2(static_cast<double>(std::max<std::size_t>(bytes, 1)));
  auto log_size = [](const MeasuredSize* s) {
    return std::log2(static_cast<double>(std::max<std::size_t>(s->bytes, 1)));
  };
  const std::optional<MeasuredTime> low = time_at(below), high = time_at(above);
  if (low && high) {
    // A measured 0 (a trivially fast case) would be log(0): floor it at a picosecond.
    const double t0 = std::max(low->seconds, 1e-12), t1 = std::max(high->seconds, 1e-12);
    const double f = (x - log_size(below)) / (log_size(above) - log_size(below));
    const double seconds = std::exp2(std::log2(t0) + (std::log2(t1) - std::log2(t0)) * f);
    const double share =
        low->spread_seconds / t0 + (high->spread_seconds / t1 - low->spread_seconds / t0) * f;
    return MeasuredTime{seconds, share * seconds};
  }
  // Farther than a factor of two from a measurement of this algorithm: the model knows better.
  std::optional<MeasuredTime> nearest;
  double distance = 1.0;
  if (low && x - log_size(below) <= distance) nearest = low, distance = x - log_size(below);
  if (high && log_size(above) - x <= distance) nearest = high;
  return nearest;
}

AlgorithmChoice AlgorithmSelector::choose(const CollectiveArgs& args, const Backend& backend,
                                          TimingForm form) const {
  if (form != TimingForm::blocking && form != TimingForm::asynchronous)
    throw Error(ErrorCode::invalid_argument,
                "AlgorithmSelector::choose: the call's form must be blocking or asynchronous, "
                "not " +
                    std::string(to_string(form)));
  const std::size_t bytes = selection_bytes(args);
  const int world = backend.world_size();
  const bool tuned_here = _tuning.backend.empty() || _tuning.backend == backend.name();
  std::string fallback;
  std::optional<Algorithm> refused_override;
  for (const AlgorithmRange& r : _overrides[static_cast<std::size_t>(args.op)]) {
    if (bytes < r.min_bytes || bytes >= r.max_bytes) continue;
    const std::string why = cannot_run(r.algorithm, args, backend);
    if (why.empty()) return {r.algorithm, "override", 0};
    fallback = "fallback: " + override_variable(args.op) + " chose " +
               std::string(to_string(r.algorithm)) + ", which cannot run (" + why + "); ";
    refused_override = r.algorithm;
    break;
  }
  // Rank every candidate: measured time where loom-tune --full timed it, else the model.
  struct Scored {
    Algorithm algorithm;
    double seconds;
    double spread_seconds;
    bool measured;
  };
  std::vector<Scored> scored;
  bool any_measured = false;
  for (Algorithm a : candidates(args.op)) {
    std::optional<MeasuredTime> m;
    if (tuned_here) m = measured(a, args.op, bytes, world, form);
    any_measured = any_measured || m.has_value();
    scored.push_back({a, m ? m->seconds : predict(a, args.op, bytes, backend.topology()),
                      m ? m->spread_seconds : 0, m.has_value()});
  }
  // With measurements, a candidate without one (it could not run when measured) is ranked
  // after the measured ones rather than by a model on another scale.
  if (any_measured)
    for (Scored& s : scored)
      if (!s.measured) s.seconds = std::numeric_limits<double>::infinity();
  // native (candidates' first) stays first unless another beat it by more than the two
  // measurements' spreads and by more than native_margin: a lead inside the rounds' scatter is
  // not evidence, and the backend's own call is the one without loom's per-message cost (and,
  // for MPI, the one its library tuned). The margin covers what the calibration's back-to-back
  // rounds do not see: over TCP at 10 Gbit/s and 32 KiB every candidate timed 52.1-52.4 us,
  // Rabenseifner won by 0.6% with tight spreads, and then ran 7% slower than MPI_Allreduce in
  // loom-collectives' interleaved rounds.
  constexpr double native_margin = 0.03;
  const Scored native = scored.front();
  auto rank = [&](const Scored& s) {
    if (s.algorithm != Algorithm::native && native.measured && s.measured &&
        s.seconds + s.spread_seconds >=
            (native.seconds - native.spread_seconds) * (1.0 - native_margin))
      return std::max(s.seconds, native.seconds);
    return s.seconds;
  };
  std::stable_sort(scored.begin(), scored.end(),
                   [&](const Scored& x, const Scored& y) { return rank(x) < rank(y); });
  for (const Scored& s : scored) {
    const std::string why = cannot_run(s.algorithm, args, backend);
    if (why.empty())
      return {s.algorithm, fallback + (s.measured ? "measured" : "model"), s.seconds};
    if (refused_override != s.algorithm)
      fallback +=
          "fallback: " + std::string(to_string(s.algorithm)) + " cannot run (" + why + "); ";
  }
  return {Algorithm::native, fallback + "native", 0};
}

std::unique_ptr<Work> AlgorithmSelector::start(Backend& backend, const CollectiveArgs& args,
                                               AlgorithmChoice& choice, std::string_view name,
                                               Backend::OperationRecord* operation) const {
  choice = choose(args, backend);
  return algorithms::start_chosen(backend, choice.algorithm, args, name, operation);
}

void AlgorithmSelector::run(Backend& backend, const CollectiveArgs& args,
                            AlgorithmChoice& choice) const {
  choice = choose(args, backend, TimingForm::blocking);
  algorithms::run_chosen(backend, choice.algorithm, args);
}

}  // namespace loom
