// Candidate timing: interleaved rounds over every (collective, size, candidate), medians and
// spreads against native.
#include "loom/candidate_timing.hpp"

#include <algorithm>
#include <chrono>
#include <limits>
#include <random>
#include <utility>

#include "loom/algorithm.hpp"
#include "loom/algorithm_selector.hpp"
#include "loom/error.hpp"

namespace loom {
namespace {

using Clock = std::chrono::steady_clock;

// One candidate at one size: its case and, once timed, its rounds.
struct Point {
  Collective collective;
  std::size_t bytes;
  Algorithm algorithm;
  TimingForm form;  // native: the form it is timed in; loom's algorithms: asynchronous (both)
  CollectiveArgs args;
  int iterations;
  std::vector<double> times;  // per round: the slowest rank's average per call
};

void perform(Backend& b, TimingForm form, Algorithm algorithm, const CollectiveArgs& args) {
  if (form == TimingForm::asynchronous)
    start_collective(b, algorithm, args)->wait();
  else
    run_collective(b, algorithm, args);
}

struct Quartiles {
  double lower, median, upper;
};

// Quartiles of `v` (not empty), interpolating between order statistics.
Quartiles quartiles(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto at = [&](double q) {
    const double position = q * static_cast<double>(v.size() - 1);
    const auto below = static_cast<std::size_t>(position);
    const std::size_t above = std::min(below + 1, v.size() - 1);
    return v[below] + (v[above] - v[below]) * (position - static_cast<double>(below));
  };
  return {at(0.25), at(0.5), at(0.75)};
}

// The spread written for `p` in the table of `form` (the selector keeps native unless a
// candidate's median plus its spread stays below native's median minus native's). Against that
// form's native, paired by round: the
// two were timed moments apart in each round, so their ratio cancels most of what the
// machine's load did to both, where an unpaired comparison would drown a steady 20% lead in
// the round-to-round swings of a shared machine. A candidate's spread is how far the median of
// its per-round ratio to native puts it above its own median, so it passes only if it beat
// native in most rounds as well as by its median; native's spread is 0. (Requiring wins in
// three rounds of four, the upper quartile, kept native where the benchmark then found
// Rabenseifner 1.1-1.4x faster.)
double spread(const Point& p, TimingForm form, const std::vector<Point>& points) {
  if (p.algorithm == Algorithm::native) return 0;
  const auto native = std::find_if(points.begin(), points.end(), [&](const Point& q) {
    return q.collective == p.collective && q.bytes == p.bytes && q.algorithm == Algorithm::native &&
           q.form == form;
  });
  const Quartiles own = quartiles(p.times);
  if (native == points.end()) return (own.upper - own.lower) / 2;
  std::vector<double> ratios;
  for (std::size_t r = 0; r < p.times.size(); ++r)
    ratios.push_back(p.times[r] / std::max(native->times[r], 1e-12));
  const double native_median = quartiles(native->times).median;
  return std::max(quartiles(ratios).median * native_median - own.median, 0.0);
}

}  // namespace

double max_over_ranks(Backend& b, double v) {
  b.allreduce(Buffer(&v, 1, DType::float64), ReduceOp::max);
  return v;
}

CollectiveArgs benchmark_args(Collective c, std::size_t bytes, int world, std::vector<float>& send,
                              std::vector<float>& recv) {
  const auto n = static_cast<std::size_t>(world);
  std::size_t count = std::max<std::size_t>(bytes / sizeof(float), 1);
  if (c == Collective::allgather || c == Collective::reduce_scatter)
    count = std::max(count / n, std::size_t{1});
  const std::size_t total =
      c == Collective::allgather || c == Collective::reduce_scatter ? count * n : count;
  if (send.size() < total) send.resize(total, 1.0f);
  if (recv.size() < total) recv.resize(total, 0.0f);
  Buffer s(send.data(), count, DType::float32), r(recv.data(), count, DType::float32);
  if (c == Collective::allgather) r = Buffer(recv.data(), count * n, DType::float32);
  if (c == Collective::reduce_scatter) s = Buffer(send.data(), count * n, DType::float32);
  if (c == Collective::broadcast) r = s;
  return {c, s, r, ReduceOp::sum, 0};
}

std::vector<Measurement> time_candidates(Backend& b, const CandidateTimingOptions& o,
                                         const std::function<void(int)>& on_round) {
  if (o.rounds < 1 || !(o.seconds_per_point > 0))
    throw Error(ErrorCode::invalid_argument,
                "time_candidates: rounds " + std::to_string(o.rounds) + " and seconds_per_point " +
                    std::to_string(o.seconds_per_point) + " must be positive");
  if (o.forms.empty()) throw Error(ErrorCode::invalid_argument, "time_candidates: no form to time");
  for (std::size_t k = 0; k < o.forms.size(); ++k) {
    if (o.forms[k] != TimingForm::blocking && o.forms[k] != TimingForm::asynchronous)
      throw Error(ErrorCode::invalid_argument,
                  "time_candidates: a form must be blocking or asynchronous, not " +
                      std::string(to_string(o.forms[k])));
    if (std::find(o.forms.begin(), o.forms.begin() + static_cast<std::ptrdiff_t>(k), o.forms[k]) !=
        o.forms.begin() + static_cast<std::ptrdiff_t>(k))
      throw Error(
          ErrorCode::invalid_argument,
          "time_candidates: the form " + std::string(to_string(o.forms[k])) + " is given twice");
  }
  // Sized once for the largest case before any case points into them, so that the cases'
  // buffers stay valid while the rounds cycle through all of them.
  std::vector<float> send, recv;
  const std::size_t largest =
      o.sizes.empty() ? 0 : *std::max_element(o.sizes.begin(), o.sizes.end());
  send.resize(largest / sizeof(float) + 1 + static_cast<std::size_t>(b.world_size()), 1.0f);
  recv.resize(send.size(), 0.0f);
  std::vector<Point> points;
  for (Collective c : o.collectives)
    for (std::size_t bytes : o.sizes) {
      const CollectiveArgs args = benchmark_args(c, bytes, b.world_size(), send, recv);
      for (Algorithm a : candidates(c)) {
        if (!cannot_run(a, args, b).empty()) continue;
        if (a == Algorithm::native) {
          for (TimingForm form : o.forms)
            points.push_back({c, selection_bytes(args), a, form, args, 0, {}});
        } else {
          points.push_back({c, selection_bytes(args), a, TimingForm::asynchronous, args, 0, {}});
        }
      }
    }

  // The (collective, size) groups' point counts, in list order (candidate_visit_order).
  std::vector<std::size_t> groups;
  for (std::size_t i = 0; i < points.size(); ++i)
    if (i == 0 || points[i].collective != points[i - 1].collective ||
        points[i].bytes != points[i - 1].bytes)
      groups.push_back(1);
    else
      ++groups.back();
  const double per_round = o.seconds_per_point / o.rounds;
  for (Point& p : points) {
    perform(b, p.form, p.algorithm, p.args);  // warm-up (and first touch of scratch)
    // One call's time from enough calls to see past the clock's resolution; max_over_ranks
    // makes the count the same on every rank. The fastest of three estimates: one estimate
    // slowed by a descheduled rank set a count of 1 call per round for 8 B, whose rounds then
    // timed the barrier's exit instead of the call (native 6.7 us where it takes 0.5 us).
    double each = std::numeric_limits<double>::infinity();
    for (int estimate = 0; estimate < 3; ++estimate)
      for (int probe = 1;; probe *= 10) {
        b.barrier();
        const auto start = Clock::now();
        for (int i = 0; i < probe; ++i) perform(b, p.form, p.algorithm, p.args);
        const double t =
            max_over_ranks(b, std::chrono::duration<double>(Clock::now() - start).count() / probe);
        if (t * probe >= 1e-4 || probe >= 1000) {
          each = std::min(each, t);
          break;
        }
      }
    p.iterations = static_cast<int>(std::clamp(per_round / std::max(each, 1e-8), 1.0, 1e6));
  }
  for (int round = 0; round < o.rounds; ++round) {
    for (std::size_t index : candidate_visit_order(groups, round)) {
      Point& p = points[index];
      b.barrier();
      const auto start = Clock::now();
      for (int i = 0; i < p.iterations; ++i) perform(b, p.form, p.algorithm, p.args);
      const double mine =
          std::chrono::duration<double>(Clock::now() - start).count() / p.iterations;
      p.times.push_back(max_over_ranks(b, mine));
    }
    if (on_round) on_round(round + 1);
  }
  std::vector<Measurement> measured;
  for (TimingForm form : o.forms)
    for (const Point& p : points)
      if (p.algorithm != Algorithm::native || p.form == form)
        measured.push_back({p.collective, b.world_size(), p.bytes, p.algorithm,
                            quartiles(p.times).median, spread(p, form, points), form});
  return measured;
}

// A fixed order would give every candidate the same neighbour in every round, whose leftover
// cache state or progress work it inherits (loom-collectives measured auto at 0.92-0.95 of its
// own algorithm, run right after native every round); a size's candidates stay together, so
// that each is timed moments from its native (the spread pairs them by round).
std::vector<std::size_t> candidate_visit_order(const std::vector<std::size_t>& group_sizes,
                                               int round) {
  std::vector<std::size_t> starts;  // each group's first index
  std::size_t total = 0;
  for (std::size_t n : group_sizes) {
    starts.push_back(total);
    total += n;
  }
  std::vector<std::size_t> order;
  order.reserve(total);
  for (std::size_t turn = 0; turn < group_sizes.size(); ++turn) {
    const std::size_t g = (turn + static_cast<std::size_t>(round)) % group_sizes.size();
    const std::size_t first = order.size();
    for (std::size_t i = 0; i < group_sizes[g]; ++i) order.push_back(starts[g] + i);
    std::mt19937 generator(static_cast<std::uint32_t>(round) * 7919u +
                           static_cast<std::uint32_t>(g) + 1u);
    for (std::size_t k = order.size(); k > first + 1; --k)
      std::swap(order[k - 1], order[first + generator() % (k - first)]);
  }
  return order;
}

}  // namespace loom
