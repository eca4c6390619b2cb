// Measuring a GradientReducer's profiled steps: each step's executor timings and its client's
// timeline put on the client's compute clock, averaged, the update and cast costs fitted and
// the wire fitted to the running plan's measured communication.
#include "loom/reducer_prediction.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "invalid_argument.hpp"
#include "loom/network_model.hpp"
#include "reducer_step_model.hpp"

namespace loom {

namespace {

using Span = ClientTimeline::Span;

// The client's compute clock: time with the spans it spent applying updates or waiting for the
// reducer taken out.
class ComputeClock {
 public:
  explicit ComputeClock(std::vector<Span> stopped) {
    std::sort(stopped.begin(), stopped.end(),
              [](const Span& a, const Span& b) { return a.start_s < b.start_s; });
    for (const Span& s : stopped) {
      if (!(s.end_s > s.start_s)) continue;
      if (!_merged.empty() && s.start_s <= _merged.back().end_s)
        _merged.back().end_s = std::max(_merged.back().end_s, s.end_s);
      else
        _merged.push_back(s);
    }
  }
  double at(double t) const {
    double stopped = 0;
    for (const Span& s : _merged) {
      if (s.start_s >= t) break;
      stopped += std::min(s.end_s, t) - s.start_s;
    }
    return t - stopped;
  }

 private:
  std::vector<Span> _merged;
};

double union_length(std::vector<Span> spans) {
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.start_s < b.start_s; });
  double total = 0, start = 0, end = -1;
  for (const Span& s : spans) {
    if (!(s.end_s > s.start_s)) continue;
    if (s.start_s > end) {
      if (end > start) total += end - start;
      start = s.start_s;
      end = s.end_s;
    } else {
      end = std::max(end, s.end_s);
    }
  }
  if (end > start) total += end - start;
  return total;
}

// Least squares of y on the features of each row (at most 3), by the normal equations.
std::optional<std::array<double, 3>> least_squares(const std::vector<std::array<double, 3>>& x,
                                                   const std::vector<double>& y,
                                                   std::size_t features) {
  double m[3][4] = {};
  for (std::size_t r = 0; r < x.size(); ++r)
    for (std::size_t i = 0; i < features; ++i) {
      for (std::size_t j = 0; j < features; ++j) m[i][j] += x[r][i] * x[r][j];
      m[i][3] += x[r][i] * y[r];
    }
  for (std::size_t c = 0; c < features; ++c) {
    std::size_t pivot = c;
    for (std::size_t r = c + 1; r < features; ++r)
      if (std::abs(m[r][c]) > std::abs(m[pivot][c])) pivot = r;
    if (std::abs(m[pivot][c]) < 1e-12 * std::max(1.0, std::abs(m[c][c]))) return std::nullopt;
    for (std::size_t j = 0; j < 4; ++j) std::swap(m[c][j], m[pivot][j]);
    for (std::size_t r = 0; r < features; ++r) {
      if (r == c) continue;
      const double f = m[r][c] / m[c][c];
      for (std::size_t j = c; j < 4; ++j) m[r][j] -= f * m[c][j];
    }
  }
  std::array<double, 3> out{};
  for (std::size_t i = 0; i < features; ++i) out[i] = m[i][3] / m[i][i];
  return out;
}

// cost = a + b x + c y over samples (x, y, seconds): the fullest model whose coefficients are
// all >= 0 (a fixed cost per call, per tensor, per element), else proportional to x + y, else
// the mean.
LinearCost fit_cost(const std::vector<std::array<double, 3>>& samples) {
  LinearCost cost;
  if (samples.empty()) return cost;
  std::vector<double> y;
  for (const auto& s : samples) y.push_back(s[2]);
  const auto rows = [&](auto make) {
    std::vector<std::array<double, 3>> x;
    for (const auto& s : samples) x.push_back(make(s));
    return x;
  };
  const auto nonnegative = [](const std::array<double, 3>& c, std::size_t k) {
    for (std::size_t i = 0; i < k; ++i)
      if (!(c[i] >= 0)) return false;
    return true;
  };
  if (auto c = least_squares(rows([](const auto& s) {
                               return std::array<double, 3>{1, s[0], s[1]};
                             }),
                             y, 3);
      c && nonnegative(*c, 3))
    return {(*c)[0], (*c)[1], (*c)[2]};
  if (auto c = least_squares(rows([](const auto& s) {
                               return std::array<double, 3>{1, s[1], 0};
                             }),
                             y, 2);
      c && nonnegative(*c, 2))
    return {(*c)[0], 0, (*c)[1]};
  if (auto c = least_squares(rows([](const auto& s) {
                               return std::array<double, 3>{1, s[0], 0};
                             }),
                             y, 2);
      c && nonnegative(*c, 2))
    return {(*c)[0], (*c)[1], 0};
  double sum = 0;
  for (double v : y) sum += v;
  cost.a = sum / static_cast<double>(y.size());
  return cost;
}

double seconds(std::int64_t ns) {
  return static_cast<double>(ns) * 1e-9;
}

std::vector<std::string> module_names(const ClientTimeline& t) {
  std::vector<std::string> out;
  for (const auto& m : t.forward) out.push_back(m.module);
  return out;
}

}  // namespace

ReducerMeasurements measure_reducer_steps(const GradientReducer& reducer,
                                          std::span<const ReducerStepRecord> steps,
                                          double latency_s) {
  const std::size_t n = reducer.num_parameters();
  if (steps.empty())
    throw_invalid_argument(
        "measure_reducer_steps: no profiled step (a step is recorded once the next one "
        "begins; profiling must be on: ExecutorOptions::profile or LOOM_TRACE)");
  if (!(latency_s >= 0)) throw_invalid_argument("measure_reducer_steps: latency_s must be >= 0");
  const std::vector<std::string> reference = module_names(steps.back().client);
  if (reference.empty())
    throw_invalid_argument(
        "measure_reducer_steps: the last recorded step has no forward (no forward ran "
        "between its backward and the next one)");
  std::map<std::string, std::size_t, std::less<>> index;
  for (std::size_t p = 0; p < n; ++p) index["grad." + reducer.parameter(p).name] = p;

  ReducerMeasurements m;
  m.ranks = reducer.backend().world_size();
  m.latency_s = latency_s;
  m.ready_s.assign(n, 0);
  m.forward.resize(reference.size());
  for (std::size_t j = 0; j < reference.size(); ++j) {
    m.forward[j].module = reference[j];
    m.forward[j].parameters = steps.back().client.forward[j].parameters;
  }
  // Steps whose period is over twice the median had something else between them and the next
  // step (an evaluation, a checkpoint, another model's steps): left out.
  std::vector<double> periods;
  for (const ReducerStepRecord& step : steps)
    if (module_names(step.client) == reference) periods.push_back(step.client.end_s);
  std::nth_element(periods.begin(),
                   periods.begin() + static_cast<std::ptrdiff_t>(periods.size() / 2),
                   periods.end());
  const double longest = 2 * periods[periods.size() / 2];
  std::vector<std::array<double, 3>> update_samples;
  double pack_s = 0, unpack_s = 0, pack_bytes = 0, unpack_bytes = 0;
  std::size_t used = 0;
  for (std::size_t s = 0; s < steps.size(); ++s) {
    const ReducerStepRecord& step = steps[s];
    const ClientTimeline& t = step.client;
    const std::string which =
        "measure_reducer_steps: step #" + std::to_string(s) + " of " + std::to_string(steps.size());
    if (module_names(t) != reference) continue;  // another forward (evaluation, a changed model)
    if (t.end_s > longest) continue;
    if (step.run.empty())
      throw_invalid_argument(which +
                             " has no profiled run (profiling is off: ExecutorOptions::profile or "
                             "LOOM_TRACE)");
    if (!(t.end_s > 0))
      throw_invalid_argument(which + " has no end (end_s " + std::to_string(t.end_s) + ")");
    std::vector<Span> stopped;
    for (const auto& [k, span] : t.updates) {
      if (k >= reducer.num_update_groups())
        throw_invalid_argument(which + " applied update group #" + std::to_string(k) + " of " +
                               std::to_string(reducer.num_update_groups()) +
                               " (was it recorded before a replan?)");
      stopped.push_back(span);
      double elements = 0;
      const std::vector<std::size_t>& group = reducer.update_group(k);
      if (reducer.plan().shard == ShardLevel::none)
        for (std::size_t p : group) elements += static_cast<double>(reducer.parameter(p).count);
      else  // the update is of this rank's pieces only
        for (const ShardPiece& piece : reducer.shard_pieces(k))
          elements += static_cast<double>(piece.count);
      update_samples.push_back(
          {static_cast<double>(group.size()), elements, std::max(0.0, span.end_s - span.start_s)});
      m.update_s += span.end_s - span.start_s;
    }
    for (const Span& w : t.waits) {
      stopped.push_back(w);
      m.wait_s += std::max(0.0, w.end_s - w.start_s);
    }
    const ComputeClock clock(stopped);

    std::vector<double> arrival(n, -1);
    std::vector<Span> comm;
    for (const NodeTiming& timing : step.run) {
      if (timing.kind == NodeKind::collective) {
        comm.push_back({seconds(timing.start_ns), seconds(timing.end_ns)});
        continue;
      }
      const bool is_pack = timing.name.ends_with(".pack");
      if (is_pack || timing.name.ends_with(".unpack")) {
        // "bucket<b>.pack": the reducer's own names.
        const std::size_t dot = timing.name.find('.');
        std::size_t b = reducer.buckets().size();
        try {
          b = std::stoul(timing.name.substr(6, dot - 6));
        } catch (const std::exception&) {
        }
        if (b < reducer.buckets().size()) {
          const double bytes = static_cast<double>(reducer.buckets()[b].bytes());
          (is_pack ? pack_s : unpack_s) += seconds(timing.end_ns - timing.start_ns);
          (is_pack ? pack_bytes : unpack_bytes) += bytes;
        }
        continue;
      }
      if (auto it = index.find(timing.name); it != index.end())
        arrival[it->second] = seconds(timing.end_ns);
    }
    if (!step.handed_over_s.empty()) {
      if (step.handed_over_s.size() != n)
        throw_invalid_argument(which + " has " + std::to_string(step.handed_over_s.size()) +
                               " hand-over times for " + std::to_string(n) + " parameters");
      arrival = step.handed_over_s;
    }
    for (std::size_t p = 0; p < n; ++p)
      if (arrival[p] < 0)
        throw_invalid_argument(which + ": the gradient of '" + reducer.parameter(p).name +
                               "' has no time in the run (was the step finished?)");
    double last = 0;
    for (std::size_t p = 0; p < n; ++p) {
      const double c = clock.at(arrival[p]);
      m.ready_s[p] += c;
      last = std::max(last, c);
    }
    const double forward_start = clock.at(t.forward.front().entered_s);
    m.after_backward_s += std::max(0.0, forward_start - last);
    for (std::size_t j = 0; j < t.forward.size(); ++j) {
      const double from = clock.at(t.forward[j].entered_s);
      const double to =
          clock.at(j + 1 < t.forward.size() ? t.forward[j + 1].entered_s : t.forward_end_s);
      m.forward[j].duration_s += std::max(0.0, to - from);
    }
    m.after_forward_s += std::max(0.0, clock.at(t.end_s) - clock.at(t.forward_end_s));
    m.step_s += t.end_s;
    m.comm_s += union_length(std::move(comm));
    ++used;
  }
  if (used == 0)
    throw_invalid_argument("measure_reducer_steps: no step has the last step's forward");
  const double k = static_cast<double>(used);
  for (double& r : m.ready_s) r /= k;
  for (ForwardPart& f : m.forward) f.duration_s /= k;
  m.after_backward_s /= k;
  m.after_forward_s /= k;
  m.step_s /= k;
  m.wait_s /= k;
  m.update_s /= k;
  m.comm_s /= k;
  m.steps = used;
  m.update = fit_cost(update_samples);
  if (pack_bytes > 0) m.pack.c = pack_s / pack_bytes;
  if (unpack_bytes > 0) m.unpack.c = unpack_s / unpack_bytes;

  // The wire: the running plan's collectives fitted to the communication measured.
  if (m.ranks > 1 && m.comm_s > 0) {
    const std::unique_ptr<Bucketer> bucketer =
        detail::make_reducer_bucketer(reducer, reducer.plan());
    detail::BuiltStep current = detail::build_reducer_step(reducer, m, reducer.plan(), *bucketer);
    current.profile.measured_comm_s = m.comm_s;
    current.profile.measured_step_s = m.step_s;
    current.profile.measured_compute_s = std::max(0.0, m.step_s - m.wait_s);
    const NetworkModel fitted = NetworkModel::fitted(current.profile, latency_s);
    m.link_bits_per_s = 8.0 / fitted.tuning().cost.beta_s_per_byte;
  }
  return m;
}

}  // namespace loom
