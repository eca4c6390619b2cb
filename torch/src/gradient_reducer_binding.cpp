// loom_torch._C.GradientReducer: what loom_torch.parallelize drives. The reducer gets a backend of
// its own over the group's ranks (ProcessGroupLoom::make_companion_backend: a new communicator
// under mpi, a new ucx group through torch's store), so its step's collectives, issued from
// autograd hooks and loom's progress thread, never interleave with the group's own operations.
#include "gradient_reducer_binding.hpp"

#include <pybind11/stl.h>
#include <torch/python.h>

#include <deque>
#include <fstream>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "loom/error.hpp"
#include "loom/gradient_reducer.hpp"
#include "loom/output_file.hpp"
#include "loom/plan.hpp"
#include "loom/reducer_prediction.hpp"
#include "process_group.hpp"
#include "tensors.hpp"

namespace py = pybind11;

namespace loom::torch {

namespace {

/// The reducer and the backend it runs on (destroyed in that order).
class TorchReducer {
 public:
  TorchReducer(ProcessGroupLoom& group, const std::vector<std::string>& names,
               const std::vector<std::string>& modules, const std::vector<at::Tensor>& parameters,
               const ReducerPlan& plan, std::optional<bool> profile)
      : _backend(group.make_companion_backend()) {
    if (names.size() != parameters.size() || modules.size() != parameters.size())
      throw Error(ErrorCode::invalid_argument,
                  "GradientReducer: " + std::to_string(names.size()) + " names and " +
                      std::to_string(modules.size()) + " module names for " +
                      std::to_string(parameters.size()) + " parameters");
    std::vector<ParameterSpec> specs;
    for (std::size_t p = 0; p < parameters.size(); ++p) {
      const at::Tensor& t = parameters[p];
      const std::string where = "parallelize: parameter '" + names[p] + "'";
      if (!t.device().is_cpu())
        throw Error(ErrorCode::unsupported,
                    where + " is on " + t.device().str() +
                        ": loom_torch.parallelize reduces CPU parameters only so far");
      specs.push_back({names[p], modules[p], static_cast<std::size_t>(t.numel()),
                       to_loom(t.scalar_type(), where)});
    }
    ExecutorOptions options;
    options.timeout = std::chrono::duration<double>(group.timeout_seconds());
    options.profile = profile;
    _profiling = options.resolved().profile.value_or(false);
    _reducer = std::make_unique<GradientReducer>(std::move(specs), *_backend, plan, options);
    _shapes.reserve(parameters.size());
    for (const at::Tensor& t : parameters) _shapes.push_back(t.sizes().vec());
  }

  GradientReducer& reducer() { return *_reducer; }
  Backend& backend() { return *_backend; }

  void ready(std::size_t p, const at::Tensor& gradient, bool used) {
    const std::string where = "parallelize: the gradient of '" + _reducer->parameter(p).name + "'";
    if (gradient.layout() != at::kStrided)
      throw Error(ErrorCode::unsupported,
                  where +
                      " is sparse; parallelize reduces dense gradients (DDP's sparse "
                      "gradients are not supported)");
    const at::Tensor dense = gradient.is_contiguous() ? gradient : gradient.contiguous();
    const Buffer buffer = to_buffer(dense, *_backend, where, "gradient");
    py::gil_scoped_release no_gil;
    _reducer->ready(p, buffer, used);
  }

  /// Parameter p's averaged gradient: a view of loom's bucket memory shaped like p, which
  /// keeps the reducer alive.
  at::Tensor gradient(std::size_t p, const std::shared_ptr<TorchReducer>& self) {
    const Buffer g = _reducer->gradient(p);
    at::ScalarType type = at::kFloat;
    switch (g.dtype()) {
      case DType::float32:
        type = at::kFloat;
        break;
      case DType::float64:
        type = at::kDouble;
        break;
      case DType::float16:
        type = at::kHalf;
        break;
      case DType::bfloat16:
        type = at::kBFloat16;
        break;
      default:
        throw Error(ErrorCode::unsupported, "parallelize: parameter '" +
                                                _reducer->parameter(p).name + "' is " +
                                                std::string(to_string(g.dtype())) +
                                                "; only floating-point parameters are trained");
    }
    return at::from_blob(
        g.data(), _shapes[p], [keep = self](void*) mutable { keep.reset(); },
        at::TensorOptions().dtype(type));
  }

  std::string with_rank(const std::string& path) const {
    if (_backend->world_size() == 1) return path;
    std::string out = path;
    const auto dot = out.rfind('.');
    const auto slash = out.rfind('/');
    const std::string suffix = ".rank" + std::to_string(_backend->rank());
    if (dot == std::string::npos || (slash != std::string::npos && dot < slash))
      out += suffix;
    else
      out.insert(dot, suffix);
    return out;
  }

  void replan(const ReducerPlan& plan) {
    _reducer->replan(plan);
    _records.clear();  // they name the old plan's update groups
  }

  bool profiling() const { return _profiling; }

  /// Keeps the step just finished (its run's timings and the client's timeline) for
  /// predict(); the last `kept` steps since the plan changed.
  void record_step(ClientTimeline client) {
    if (!_profiling) return;
    _records.push_back(
        {_reducer->executor().last_run(), std::move(client), _reducer->handed_over_seconds()});
    while (_records.size() > kept) _records.pop_front();
  }

  std::vector<ReducerStepRecord> records() const { return {_records.begin(), _records.end()}; }
  void clear_records() { _records.clear(); }

  /// bucket_cap_mb="auto", timed: the shortlist (collective), then one trial step per plan in
  /// turn (PlanTrials), then rank 0's trial steps decide (collective).
  /// Returns the decision when there is nothing to time (only the running plan shortlisted).
  std::optional<PlanDecision> shortlist_plans(std::size_t keep, int rounds) {
    const std::vector<ReducerStepRecord> steps = records();
    PlanShortlist list =
        shortlist_reducer_plans(*_reducer, steps, PlanSearch::for_gradient_reducer(), keep);
    _records.clear();
    if (list.plans.size() == 1) {
      const double measured = list.measured_step_s;
      return decide_reducer_plan(*_reducer, list, std::span<const double>(&measured, 1));
    }
    _trials.emplace(list.plans.size(), rounds);
    _shortlist = std::move(list);
    return std::nullopt;
  }

  /// Records the step just run under the current trial plan; replans to the next one, or (the
  /// trials done) decides. Returns the decision once made.
  std::optional<PlanDecision> trial_step(double period_s) {
    if (!_trials) throw Error(ErrorCode::invalid_argument, "trial_step: no plans are being timed");
    const std::size_t next = _trials->record(period_s);
    if (!_trials->done()) {
      replan(_shortlist->plans[next].plan);
      return std::nullopt;
    }
    const std::vector<double> steps = _trials->steps_s();
    _trials.reset();
    const PlanShortlist list = std::move(*_shortlist);
    _shortlist.reset();
    PlanDecision chosen = decide_reducer_plan(*_reducer, list, steps);
    _records.clear();
    return chosen;
  }

  bool timing_plans() const { return _trials.has_value(); }

  static constexpr std::size_t kept = 16;

 private:
  std::shared_ptr<Backend> _backend;
  std::unique_ptr<GradientReducer> _reducer;
  std::vector<std::vector<std::int64_t>> _shapes;
  bool _profiling = false;
  std::deque<ReducerStepRecord> _records;
  std::optional<PlanShortlist> _shortlist;
  std::optional<PlanTrials> _trials;
};

py::dict automatic_plan_dict(const PlanDecision& chosen) {
  py::dict d;
  d["plan"] = describe(chosen.plan);
  d["predicted_ms"] = chosen.predicted_step_s * 1e3;
  d["replaced_predicted_ms"] = chosen.current_predicted_step_s * 1e3;
  d["replaced_measured_ms"] = chosen.measured_step_s * 1e3;
  d["candidates"] = chosen.candidates;
  d["changed"] = chosen.changed;
  d["bucket_cap_mb"] = static_cast<double>(chosen.plan.bucket_cap_bytes) / (1 << 20);
  d["first_bucket_mb"] = static_cast<double>(chosen.plan.first_bucket_bytes) / (1 << 20);
  d["partition_large"] = chosen.plan.partition_large;
  d["collectives_in_flight"] = chosen.plan.collectives_in_flight;
  d["priority"] = std::string(to_string(chosen.plan.priority));
  d["wire_ratio"] = chosen.plan.wire_ratio;
  py::list timed;
  for (const TimedPlan& t : chosen.timed) {
    py::dict e;
    e["plan"] = describe(t.plan);
    e["predicted_ms"] = t.predicted_step_s * 1e3;
    e["measured_ms"] = t.measured_step_s * 1e3;
    timed.append(e);
  }
  d["timed"] = timed;
  return d;
}

py::dict prediction_dict(const PlanPrediction& p, std::size_t steps) {
  py::dict d;
  d["plan"] = describe(p.plan);
  d["buckets"] = p.buckets;
  d["predicted_ms"] = p.step_s * 1e3;
  d["measured_ms"] = p.measured_step_s * 1e3;
  d["error"] = p.measured_step_s > 0 ? (p.step_s - p.measured_step_s) / p.measured_step_s : 0.0;
  d["steps"] = steps;
  py::dict parts;
  parts["backward_ms"] = p.backward_s * 1e3;
  parts["forward_ms"] = p.forward_s * 1e3;
  parts["other_ms"] = p.other_s * 1e3;
  parts["update_ms"] = p.update_s * 1e3;
  parts["wire_ms"] = p.wire_s * 1e3;
  parts["comm_ms"] = p.comm_s * 1e3;
  parts["exposed_ms"] = p.exposed_s * 1e3;
  parts["wait_ms"] = p.wait_s * 1e3;
  parts["link_gbit_s"] = p.link_bits_per_s * 1e-9;
  d["breakdown"] = parts;
  return d;
}

ReducerPlan make_plan(double cap_mb, double first_mb, bool partition, std::size_t in_flight,
                      const std::string& compression, bool track_usage,
                      std::vector<std::size_t> ready_order, std::vector<std::size_t> issue_order,
                      const std::string& priority, double wire_ratio = 1.0) {
  if (priority != "forward" && priority != "ready")
    throw Error(ErrorCode::invalid_argument,
                "parallelize: priority must be 'forward' or 'ready', not '" + priority + "'");
  if (!(cap_mb > 0) || !(first_mb > 0))
    throw Error(ErrorCode::invalid_argument,
                "parallelize: bucket_cap_mb and first_bucket_mb must be > 0 (got " +
                    std::to_string(cap_mb) + " and " + std::to_string(first_mb) + ")");
  ReducerPlan plan;
  plan.bucket_cap_bytes = static_cast<std::size_t>(cap_mb * (1 << 20));
  plan.first_bucket_bytes = static_cast<std::size_t>(first_mb * (1 << 20));
  if (plan.bucket_cap_bytes == 0) plan.bucket_cap_bytes = 1;
  if (plan.first_bucket_bytes == 0) plan.first_bucket_bytes = 1;
  plan.partition_large = partition;
  plan.collectives_in_flight = in_flight;
  plan.compression = parse_compression(compression);
  plan.track_usage = track_usage;
  plan.external_updates = true;
  plan.ready_order = std::move(ready_order);
  plan.issue_order = std::move(issue_order);
  plan.priority = priority == "forward" ? IssuePriority::forward : IssuePriority::ready;
  plan.wire_ratio = wire_ratio;
  return plan;
}

}  // namespace

void bind_gradient_reducer(py::module_& m) {
  using Self = std::shared_ptr<TorchReducer>;
  py::class_<TorchReducer, Self>(
      m, "GradientReducer",
      "loom's GradientReducer for loom_torch.parallelize: gradients handed over from autograd "
      "hooks, bucketed and averaged in loom's fixed order on a duplicate of the group's "
      "communicator, released per update group as their buckets land")
      .def(py::init([](ProcessGroupLoom& group, const std::vector<std::string>& names,
                       const std::vector<std::string>& modules,
                       const std::vector<at::Tensor>& parameters, double cap_mb, double first_mb,
                       bool partition, std::size_t in_flight, const std::string& compression,
                       bool track_usage, std::optional<bool> profile, const std::string& priority) {
             const ReducerPlan plan = make_plan(cap_mb, first_mb, partition, in_flight, compression,
                                                track_usage, {}, {}, priority);
             py::gil_scoped_release no_gil;
             return std::make_shared<TorchReducer>(group, names, modules, parameters, plan,
                                                   profile);
           }),
           py::arg("group"), py::arg("names"), py::arg("modules"), py::arg("parameters"),
           py::arg("bucket_cap_mb"), py::arg("first_bucket_mb"), py::arg("partition_large"),
           py::arg("collectives_in_flight"), py::arg("compression"), py::arg("track_usage"),
           py::arg("profile"), py::arg("priority") = "ready")
      .def("begin", [](TorchReducer& r) { r.reducer().begin(); })
      .def("in_step", [](TorchReducer& r) { return r.reducer().in_step(); })
      .def("ready", &TorchReducer::ready, py::arg("parameter"), py::arg("gradient"),
           py::arg("used") = true)
      .def("mark_unused", [](TorchReducer& r, std::size_t p) { r.reducer().mark_unused(p); })
      .def("handed_over", [](TorchReducer& r, std::size_t p) { return r.reducer().handed_over(p); })
      .def(
          "missing",
          [](TorchReducer& r) {
            std::vector<std::size_t> out;
            for (std::size_t p = 0; p < r.reducer().num_parameters(); ++p)
              if (!r.reducer().handed_over(p)) out.push_back(p);
            return out;
          },
          "Parameters not handed over in this step")
      .def("backward_done", [](TorchReducer& r) { r.reducer().backward_done(); })
      .def("poll", [](TorchReducer& r) { return r.reducer().poll(); })
      .def(
          "wait_update", [](TorchReducer& r, std::size_t k) { r.reducer().wait_update(k); },
          py::call_guard<py::gil_scoped_release>())
      .def("updated", [](TorchReducer& r, std::size_t k) { r.reducer().updated(k); })
      .def("globally_unused",
           [](TorchReducer& r, std::size_t p) { return r.reducer().globally_unused(p); })
      .def(
          "finish", [](TorchReducer& r) { r.reducer().finish(); },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "gradient", [](const Self& r, std::size_t p) { return r->gradient(p, r); },
          py::arg("parameter"))
      .def("update_groups",
           [](TorchReducer& r) {
             std::vector<std::vector<std::size_t>> out;
             for (std::size_t k = 0; k < r.reducer().num_update_groups(); ++k)
               out.push_back(r.reducer().update_group(k));
             return out;
           })
      .def("num_buckets", [](TorchReducer& r) { return r.reducer().buckets().size(); })
      .def("bucket_bytes",
           [](TorchReducer& r) {
             std::vector<std::size_t> out;
             for (const Bucket& b : r.reducer().buckets()) out.push_back(b.bytes());
             return out;
           })
      .def("describe_plan", [](TorchReducer& r) { return describe(r.reducer().plan()); })
      .def("observed_ready_order",
           [](TorchReducer& r) { return r.reducer().observed_ready_order(); })
      .def(
          "agreed",
          [](TorchReducer& r, const std::vector<std::size_t>& order) {
            return r.reducer().agreed(order);
          },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "replan",
          [](TorchReducer& r, double cap_mb, double first_mb, bool partition, std::size_t in_flight,
             const std::string& compression, bool track_usage, std::vector<std::size_t> ready_order,
             std::vector<std::size_t> issue_order, const std::string& priority, double wire_ratio) {
            const ReducerPlan plan =
                make_plan(cap_mb, first_mb, partition, in_flight, compression, track_usage,
                          std::move(ready_order), std::move(issue_order), priority, wire_ratio);
            py::gil_scoped_release no_gil;
            r.replan(plan);
          },
          py::arg("bucket_cap_mb"), py::arg("first_bucket_mb"), py::arg("partition_large"),
          py::arg("collectives_in_flight"), py::arg("compression"), py::arg("track_usage"),
          py::arg("ready_order"), py::arg("issue_order"), py::arg("priority") = "ready",
          py::arg("wire_ratio") = 1.0,
          "Rebuilds the buckets with a new plan (collective: every rank, between steps)")
      .def("issue_order", [](TorchReducer& r) { return r.reducer().executor().issue_order(); })
      .def(
          "bucket_issue_order", [](TorchReducer& r) { return r.reducer().issue_order(); },
          "The buckets in the order their allreduces are issued")
      .def(
          "bucket_parameters",
          [](TorchReducer& r) {
            std::vector<std::vector<std::size_t>> out;
            for (const Bucket& b : r.reducer().buckets()) {
              std::vector<std::size_t> in;
              for (const BucketPiece& piece : b.pieces) in.push_back(piece.gradient);
              out.push_back(std::move(in));
            }
            return out;
          },
          "Per bucket, the parameters (indices) it holds pieces of")
      .def("dump_dot",
           [](TorchReducer& r, const std::string& path) {
             std::ofstream out = open_output_file(path, "DOT file");
             r.reducer().executor().dump_dot(out);
             close_output_file(out, path, "DOT file");
           })
      .def("dot",
           [](TorchReducer& r) {
             std::ostringstream out;
             r.reducer().executor().dump_dot(out);
             return out.str();
           })
      .def(
          "write_trace",
          [](TorchReducer& r, const std::string& path) {
            const std::string mine = r.with_rank(path);
            r.reducer().executor().write_trace(mine);
            return mine;
          },
          "Writes this rank's Chrome trace of the last finished step (path gets .rank<r> with "
          "several ranks); returns the path written")
      .def("explain", [](TorchReducer& r) { return r.reducer().explain(); })
      .def("profiling", &TorchReducer::profiling)
      .def(
          "record_step",
          [](TorchReducer& r, double end_s,
             const std::vector<std::tuple<std::string, std::vector<std::size_t>, double, double>>&
                 forward,
             double forward_end_s,
             const std::vector<std::tuple<std::size_t, double, double>>& updates,
             const std::vector<std::pair<double, double>>& waits) {
            ClientTimeline t;
            t.end_s = end_s;
            for (const auto& [module, parameters, entered, resumed] : forward)
              t.forward.push_back({module, parameters, entered, resumed});
            t.forward_end_s = forward_end_s;
            for (const auto& [k, start, end] : updates) t.updates.push_back({k, {start, end}});
            for (const auto& [start, end] : waits) t.waits.push_back({start, end});
            r.record_step(std::move(t));
          },
          py::arg("end_s"), py::arg("forward"), py::arg("forward_end_s"), py::arg("updates"),
          py::arg("waits"),
          "Keeps the step just finished for predict() (seconds since its begin(); a no-op "
          "unless profiling)")
      .def("num_records", [](TorchReducer& r) { return r.records().size(); })
      .def("clear_records", &TorchReducer::clear_records)
      .def(
          "predict",
          [](TorchReducer& r) {
            const std::vector<ReducerStepRecord> records = r.records();
            ReducerMeasurements m;
            PlanPrediction p;
            {
              py::gil_scoped_release no_gil;
              m = measure_reducer_steps(r.reducer(), records);
              p = predict_reducer_step(r.reducer(), m, r.reducer().plan());
            }
            py::dict d = prediction_dict(p, m.steps);
            py::dict measured;
            measured["wait_ms"] = m.wait_s * 1e3;
            measured["update_ms"] = m.update_s * 1e3;
            measured["comm_ms"] = m.comm_s * 1e3;
            d["measured"] = measured;
            return d;
          },
          "The plan in force's step predicted by the step simulator from the recorded steps, "
          "beside their measured mean")
      .def(
          "plan_automatically",
          [](TorchReducer& r) {
            const std::vector<ReducerStepRecord> records = r.records();
            PlanDecision chosen;
            {
              py::gil_scoped_release no_gil;
              chosen = choose_reducer_plan(r.reducer(), records);
            }
            r.clear_records();
            return automatic_plan_dict(chosen);
          },
          "Collective: rank 0 predicts the candidate plans from its recorded steps and every "
          "rank replans to its fastest")
      .def(
          "shortlist_plans",
          [](TorchReducer& r, std::size_t keep, int rounds) -> py::object {
            std::optional<PlanDecision> chosen;
            {
              py::gil_scoped_release no_gil;
              chosen = r.shortlist_plans(keep, rounds);
            }
            if (!chosen) return py::none();
            return automatic_plan_dict(*chosen);
          },
          py::arg("keep"), py::arg("rounds"),
          "Collective: rank 0 predicts the candidate plans from its recorded steps and shares "
          "its shortlist (the running plan first), timed one step each in turn, `rounds` "
          "rounds, through trial_step() (None); or, no plan predicted faster than the running "
          "one, keeps it (the decision, a dict)")
      .def(
          "trial_step",
          [](TorchReducer& r, double period_s) -> py::object {
            std::optional<PlanDecision> chosen;
            {
              py::gil_scoped_release no_gil;
              chosen = r.trial_step(period_s);
            }
            if (!chosen) return py::none();
            return automatic_plan_dict(*chosen);
          },
          py::arg("period_s"),
          "Collective, between steps: records the period of the step the current trial plan "
          "ran and replans to the next (None), or, the trials done, decides on rank 0's "
          "trial steps (PlanTrials::steps_s) and replans every rank to the fastest (the decision, "
          "a dict)")
      .def("timing_plans", &TorchReducer::timing_plans)
      .def("rank", [](TorchReducer& r) { return r.backend().rank(); })
      .def("world_size", [](TorchReducer& r) { return r.backend().world_size(); })
      .def("flight_record", [](TorchReducer& r) {
        Backend& b = r.backend();
        return b.flight_recorder().to_json(b.rank(), b.world_size(), b.name(), "requested");
      });
}

}  // namespace loom::torch
