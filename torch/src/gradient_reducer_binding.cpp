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
#include <mutex>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "device_order.hpp"
#include "loom/cuda_device.hpp"
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
               const ReducerPlan& plan, std::optional<bool> profile) {
    if (names.size() != parameters.size() || modules.size() != parameters.size())
      throw Error(ErrorCode::invalid_argument,
                  "GradientReducer: " + std::to_string(names.size()) + " names and " +
                      std::to_string(modules.size()) + " module names for " +
                      std::to_string(parameters.size()) + " parameters");
    std::vector<ParameterSpec> specs;
    std::vector<int> cuda_devices;
    bool cpu_parameters = false;
    for (std::size_t p = 0; p < parameters.size(); ++p) {
      const at::Tensor& t = parameters[p];
      const std::string where = "parallelize: parameter '" + names[p] + "'";
      if (!t.device().is_cpu() && !t.device().is_cuda())
        throw Error(ErrorCode::unsupported,
                    where + " is on " + t.device().str() +
                        ": parallelize trains parameters on the CPU or on a CUDA device");
      if (t.is_cuda()) {
        if (std::find(cuda_devices.begin(), cuda_devices.end(), t.device().index()) ==
            cuda_devices.end())
          cuda_devices.push_back(t.device().index());
      } else {
        cpu_parameters = true;
      }
      specs.push_back({names[p], modules[p], static_cast<std::size_t>(t.numel()),
                       to_loom(t.scalar_type(), where)});
    }
    // A CUDA model's buckets: in device memory of its GPU (loom's kernels copy each gradient in
    // on a stream of the reducer's, ordered after torch's current stream; the collective moves
    // device memory, on NCCL or staged), else in host memory, each gradient staged through its
    // slot there (ready() copies it in; the client copies the average back into .grad), as DDP
    // on Gloo stages CUDA gradients.
    std::string why;
    const std::optional<BucketMemory> wanted = bucket_memory_from_environment();
    std::optional<BucketMemory> memory =
        choose_bucket_memory(wanted, cuda::built_with_cuda(), plan.shard != ShardLevel::none,
                             static_cast<int>(cuda_devices.size()), cpu_parameters, why);
    if (!memory) throw Error(ErrorCode::unsupported, "parallelize: " + why);
    // Where the group has no path for CUDA memory (no NCCL, a transport that does not stage),
    // the host buckets' staging needs none; asked for, device buckets are the named error.
    if (*memory == BucketMemory::device && !wanted && !group.may_move_device_memory())
      memory = BucketMemory::host;
    // The ranks agree first, over a host companion every rank opens alike: ranks that chose
    // differently would open different companions and meet only at the timeout.
    std::shared_ptr<Backend> host = group.make_companion_backend();
    agree_on_bucket_memory(*host, *memory);
    cuda::NativeStream stream = nullptr;
    if (*memory == BucketMemory::device) {
      _device = cuda_devices.front();
      const std::string where = "parallelize";
      stream = _order.stream(_device, where);
      // On NCCL every collective is enqueued on the reducer's stream itself, behind the
      // copies in: an update group's averages are then ready behind that stream once its
      // collectives are issued (wait_update orders torch's current stream after it).
      auto [backend, path] =
          group.make_companion_device_backend(_device, stream, where, /*on_stream=*/true);
      _backend = std::move(backend);
      _device_path = path;
      for (ParameterSpec& spec : specs) spec.device = Device::cuda(_device);
    } else {
      _backend = std::move(host);
    }
    ExecutorOptions options;
    options.timeout = std::chrono::duration<double>(group.timeout_seconds());
    options.profile = profile;
    _profiling = options.resolved().profile.value_or(false);
    _reducer =
        std::make_unique<GradientReducer>(std::move(specs), *_backend, plan, options, stream);
    _shapes.reserve(parameters.size());
    for (const at::Tensor& t : parameters) _shapes.push_back(t.sizes().vec());
  }

  /// Whether the buckets are in device memory (gradient() and the slots are CUDA tensors).
  bool device_buckets() const { return _device >= 0; }
  /// "nccl" or "staged" for device buckets, "" for host buckets.
  std::string device_path() const {
    if (!_device_path) return "";
    return *_device_path == DevicePath::nccl ? "nccl" : "staged";
  }

  /// Waits for update group k: on device buckets over NCCL, whose collectives run on the
  /// reducer's stream, until they were issued, then torch's current stream waits for that
  /// stream on the device (as DDP's work.wait() on NCCL); otherwise until they completed.
  void wait_update(std::size_t k) {
    if (_device_path != DevicePath::nccl) {
      py::gil_scoped_release no_gil;
      _reducer->wait_update(k);
      return;
    }
    {
      py::gil_scoped_release no_gil;
      _reducer->wait_issued(k);
    }
    _order.current_after("parallelize");
  }

  /// Parameter p had no gradient in this step: its slot is zeroed, on device buckets after
  /// torch's current stream (which may still read it: .grad is the slot).
  void mark_unused(std::size_t p) {
    if (device_buckets()) _order.after_current(slot_of(p), "parallelize");
    _reducer->mark_unused(p);
  }

  /// Ends the step; the gradients held for the device copies are let go (the step's
  /// collectives, which ran after those copies, have completed).
  void finish() {
    _reducer->finish();
    std::lock_guard lock(_held_mutex);
    _held.clear();
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
    if (gradient.is_cuda() && device_buckets()) {
      if (gradient.device().index() != _device)
        throw Error(ErrorCode::invalid_argument,
                    where + " is on " + gradient.device().str() +
                        "; the parameters are on cuda:" + std::to_string(_device));
      const at::Tensor dense = gradient.is_contiguous() ? gradient : gradient.contiguous();
      const Buffer buffer = to_buffer(dense, *_backend, where, "gradient");
      // The reducer's stream waits for torch's current stream (where autograd wrote it), and
      // the tensor is held until the step ends: the caching allocator must not hand its memory
      // out while loom's copy may still read it. A gradient that is its bucket slot (.grad as
      // the bucket view) is loom's own memory.
      _order.after_current(dense, where);
      if (dense.data_ptr() != _reducer->gradient(p).data() && !_order.skips().input_hold) {
        std::lock_guard lock(_held_mutex);
        _held.push_back(dense);
      }
      py::gil_scoped_release no_gil;
      _reducer->ready(p, buffer, used);
      return;
    }
    if (gradient.is_cuda()) {
      // Staged: straight into the parameter's slot of the host bucket (a copy that waits for
      // torch's current stream, where autograd produced the gradient), scaled there in place.
      const at::Tensor slot = slot_of(p);
      if (gradient.sizes() != slot.sizes() || gradient.scalar_type() != slot.scalar_type())
        throw Error(ErrorCode::invalid_argument,
                    where + " is " + std::string(c10::toString(gradient.scalar_type())) +
                        c10::str(gradient.sizes()) + "; the parameter is " +
                        std::string(c10::toString(slot.scalar_type())) + c10::str(slot.sizes()));
      {
        py::gil_scoped_release no_gil;
        slot.copy_(gradient);
      }
      const Buffer buffer = to_buffer(slot, *_backend, where, "gradient");
      py::gil_scoped_release no_gil;
      _reducer->ready(p, buffer, used);
      return;
    }
    const at::Tensor dense = gradient.is_contiguous() ? gradient : gradient.contiguous();
    const Buffer buffer = to_buffer(dense, *_backend, where, "gradient");
    py::gil_scoped_release no_gil;
    _reducer->ready(p, buffer, used);
  }

  /// Parameter p's slot in the host bucket, shaped like p (valid until the next replan()).
  at::Tensor slot_of(std::size_t p) const {
    const Buffer g = _reducer->gradient(p);
    return at::from_blob(g.data(), _shapes[p], options_of(p));
  }

  /// Parameter p's dtype, on the buckets' device.
  at::TensorOptions options_of(std::size_t p) const {
    at::TensorOptions options = at::TensorOptions().dtype(scalar_type_of(p));
    if (device_buckets()) options = options.device(at::Device(at::kCUDA, _device));
    return options;
  }

  /// Parameter p's averaged gradient: a view of loom's bucket memory shaped like p, which
  /// keeps the reducer alive.
  at::Tensor gradient(std::size_t p, const std::shared_ptr<TorchReducer>& self) {
    const Buffer g = _reducer->gradient(p);
    return at::from_blob(
        g.data(), _shapes[p], [keep = self](void*) mutable { keep.reset(); }, options_of(p));
  }

  /// A sharded plan's parameter p in loom's memory, shaped like p (the parameters become views
  /// of it), which keeps the reducer alive.
  at::Tensor parameter_values(std::size_t p, const std::shared_ptr<TorchReducer>& self) {
    const Buffer v = _reducer->parameter_values(p);
    return at::from_blob(
        v.data(), _shapes[p], [keep = self](void*) mutable { keep.reset(); },
        at::TensorOptions().dtype(scalar_type_of(p)));
  }

  /// Update group k's pieces on this rank: (parameter, offset, count, values, gradient), the
  /// tensors 1-D views of loom's memory that keep the reducer alive.
  std::vector<std::tuple<std::size_t, std::size_t, std::size_t, at::Tensor, at::Tensor>>
  shard_pieces(std::size_t k, const std::shared_ptr<TorchReducer>& self) {
    std::vector<std::tuple<std::size_t, std::size_t, std::size_t, at::Tensor, at::Tensor>> out;
    for (const ShardPiece& piece : _reducer->shard_pieces(k)) {
      const auto view = [&](const Buffer& b) {
        return at::from_blob(
            b.data(), {static_cast<std::int64_t>(piece.count)},
            [keep = self](void*) mutable { keep.reset(); },
            at::TensorOptions().dtype(scalar_type_of(piece.parameter)));
      };
      out.emplace_back(piece.parameter, piece.offset, piece.count, view(piece.values),
                       view(piece.gradient));
    }
    return out;
  }

  at::ScalarType scalar_type_of(std::size_t p) const {
    const DType dtype = _reducer->parameter(p).dtype;
    switch (dtype) {
      case DType::float32:
        return at::kFloat;
      case DType::float64:
        return at::kDouble;
      case DType::float16:
        return at::kHalf;
      case DType::bfloat16:
        return at::kBFloat16;
      default:
        throw Error(ErrorCode::unsupported, "parallelize: parameter '" +
                                                _reducer->parameter(p).name + "' is " +
                                                std::string(to_string(dtype)) +
                                                "; only floating-point parameters are trained");
    }
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
  std::optional<PlanDecision> shortlist_plans(const PlanSearch& search) {
    search.check("shortlist_plans");
    const std::vector<ReducerStepRecord> steps = records();
    PlanShortlist list = shortlist_reducer_plans(*_reducer, steps, search, search.shortlist);
    const int rounds = search.trial_runs;
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
  // Device buckets: the reducer's stream, ordered after torch's current stream before each
  // hand-over (declared first: the backend and the reducer enqueue on it until they are gone),
  // the GPU (-1: host buckets), the path the buckets travel, and the gradients held until the
  // step ends.
  DeviceOrder _order;
  int _device = -1;
  std::optional<DevicePath> _device_path;
  std::mutex _held_mutex;
  std::vector<at::Tensor> _held;
  std::shared_ptr<Backend> _backend;
  std::unique_ptr<GradientReducer> _reducer;
  std::vector<std::vector<std::int64_t>> _shapes;
  bool _profiling = false;
  std::deque<ReducerStepRecord> _records;
  std::optional<PlanShortlist> _shortlist;
  std::optional<PlanTrials> _trials;
};

double bytes_to_mib(std::size_t bytes) {
  return static_cast<double>(bytes) / (1 << 20);
}

py::dict automatic_plan_dict(const PlanDecision& chosen) {
  py::dict d;
  d["plan"] = describe(chosen.plan);
  d["predicted_ms"] = chosen.predicted_step_s * 1e3;
  d["replaced_predicted_ms"] = chosen.current_predicted_step_s * 1e3;
  d["replaced_measured_ms"] = chosen.measured_step_s * 1e3;
  d["candidates"] = chosen.candidates;
  d["changed"] = chosen.changed;
  // The plan's fields as plain values (the dict is the user's record, saved as JSON).
  d["bucket_cap_mb"] = bytes_to_mib(chosen.plan.bucket_cap_bytes);
  d["first_bucket_mb"] = bytes_to_mib(chosen.plan.first_bucket_bytes);
  d["partition_large"] = chosen.plan.partition_large;
  d["collectives_in_flight"] = chosen.plan.collectives_in_flight;
  d["priority"] = std::string(to_string(chosen.plan.priority));
  d["wire_ratio"] = chosen.plan.wire_ratio;
  d["shard"] = std::string(to_string(chosen.plan.shard));
  py::list timed;
  for (const TimedPlan& t : chosen.timed) {
    py::dict e;
    e["plan"] = describe(t.plan);
    e["predicted_ms"] = t.predicted_step_s * 1e3;
    e["measured_ms"] = t.measured_step_s * 1e3;
    e["memory_mb"] = bytes_to_mib(t.memory_bytes);
    e["fits"] = t.fits;
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

// A loom::Error for bad input, as Python's ValueError (what a bad argument raises in Python).
template <typename F>
auto as_value_error(F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    if (e.code() == ErrorCode::invalid_argument) throw py::value_error(e.what());
    throw;
  }
}

std::size_t mib_to_bytes(double mb) {
  if (!(mb > 0)) return 0;  // check() names it
  const auto bytes = static_cast<std::size_t>(mb * (1 << 20));
  return bytes == 0 ? 1 : bytes;
}

IssuePriority parse_priority(const std::string& name) {
  if (name == "forward") return IssuePriority::forward;
  if (name == "ready") return IssuePriority::ready;
  throw py::value_error("ReducerPlan: priority must be 'forward' or 'ready', not '" + name + "'");
}

// ReducerPlan as Python sees it: sizes in MiB, compression and priority by name.
void bind_plan(py::module_& m) {
  py::class_<ReducerPlan>(
      m, "ReducerPlan",
      "How parallelize buckets, orders and reduces (loom's ReducerPlan): parallelize's "
      "bucket_cap_mb, first_bucket_mb, partition_large, collectives_in_flight, compression, "
      "find_unused_parameters (track_usage), priority and shard, field for field")
      .def(py::init([](double cap_mb, double first_mb, bool partition, std::size_t in_flight,
                       const std::string& compression, bool track_usage,
                       const std::string& priority, double wire_ratio, const std::string& shard) {
             ReducerPlan plan;
             plan.bucket_cap_bytes = mib_to_bytes(cap_mb);
             plan.first_bucket_bytes = mib_to_bytes(first_mb);
             plan.partition_large = partition;
             plan.collectives_in_flight = in_flight;
             plan.compression = as_value_error([&] { return parse_compression(compression); });
             plan.track_usage = track_usage;
             plan.priority = parse_priority(priority);
             plan.wire_ratio = wire_ratio;
             plan.external_updates = true;
             plan.shard = as_value_error([&] { return parse_shard_level(shard); });
             return plan;
           }),
           py::kw_only(), py::arg("bucket_cap_mb") = 25.0, py::arg("first_bucket_mb") = 1.0,
           py::arg("partition_large") = false, py::arg("collectives_in_flight") = 0,
           py::arg("compression") = "none", py::arg("track_usage") = false,
           py::arg("priority") = "ready", py::arg("wire_ratio") = 1.0, py::arg("shard") = "none")
      .def_property(
          "shard", [](const ReducerPlan& p) { return std::string(to_string(p.shard)); },
          [](ReducerPlan& p, const std::string& name) {
            p.shard = as_value_error([&] { return parse_shard_level(name); });
          })
      .def_property(
          "bucket_cap_mb", [](const ReducerPlan& p) { return bytes_to_mib(p.bucket_cap_bytes); },
          [](ReducerPlan& p, double mb) { p.bucket_cap_bytes = mib_to_bytes(mb); })
      .def_property(
          "first_bucket_mb",
          [](const ReducerPlan& p) { return bytes_to_mib(p.first_bucket_bytes); },
          [](ReducerPlan& p, double mb) { p.first_bucket_bytes = mib_to_bytes(mb); })
      .def_readwrite("partition_large", &ReducerPlan::partition_large)
      .def_readwrite("collectives_in_flight", &ReducerPlan::collectives_in_flight)
      .def_property(
          "compression", [](const ReducerPlan& p) { return std::string(to_string(p.compression)); },
          [](ReducerPlan& p, const std::string& name) {
            p.compression = as_value_error([&] { return parse_compression(name); });
          })
      .def_readwrite("track_usage", &ReducerPlan::track_usage)
      .def_property(
          "priority", [](const ReducerPlan& p) { return std::string(to_string(p.priority)); },
          [](ReducerPlan& p, const std::string& name) { p.priority = parse_priority(name); })
      .def_readwrite("wire_ratio", &ReducerPlan::wire_ratio)
      .def_readwrite("ready_order", &ReducerPlan::ready_order)
      .def_readwrite("issue_order", &ReducerPlan::issue_order)
      .def_readwrite("forward_order", &ReducerPlan::forward_order)
      .def(
          "check",
          [](const ReducerPlan& p, const std::string& who) {
            as_value_error([&] {
              p.check(who);
              return 0;
            });
          },
          py::arg("who") = "ReducerPlan", "ValueError naming the first bad field, '<who>: ...'")
      .def("describe", [](const ReducerPlan& p) { return describe(p); })
      .def("__repr__", [](const ReducerPlan& p) { return "ReducerPlan(" + describe(p) + ")"; })
      .def("copy", [](const ReducerPlan& p) { return p; })
      .def("__copy__", [](const ReducerPlan& p) { return p; })
      .def("__deepcopy__", [](const ReducerPlan& p, py::dict) { return p; })
      .def("__eq__", [](const ReducerPlan& a, const ReducerPlan& b) {
        return same_plan(a, b) && a.compression == b.compression &&
               a.track_usage == b.track_usage && a.ready_order == b.ready_order &&
               a.forward_order == b.forward_order;
      });

  py::class_<PlanSearch>(
      m, "PlanSearch", "What bucket_cap_mb='auto' searches and how it decides (loom's PlanSearch)")
      .def_static("for_gradient_reducer", &PlanSearch::for_gradient_reducer)
      .def_property_readonly("caps_mb",
                             [](const PlanSearch& s) {
                               std::vector<double> out;
                               for (std::size_t c : s.caps_bytes) out.push_back(bytes_to_mib(c));
                               return out;
                             })
      .def_readwrite("max_in_flight", &PlanSearch::max_in_flight)
      .def_readwrite("profile_runs", &PlanSearch::profile_runs)
      .def_readwrite("shortlist", &PlanSearch::shortlist)
      .def_readwrite("trial_runs", &PlanSearch::trial_runs)
      .def_readwrite("shortlist_margin", &PlanSearch::shortlist_margin)
      .def_property(
          "shard_levels",
          [](const PlanSearch& s) {
            std::vector<std::string> out;
            for (ShardLevel l : s.shard_levels) out.push_back(to_string(l));
            return out;
          },
          [](PlanSearch& s, const std::vector<std::string>& names) {
            s.shard_levels.clear();
            for (const std::string& n : names)
              s.shard_levels.push_back(as_value_error([&] { return parse_shard_level(n); }));
          })
      .def_property(
          "memory_budget_mb",
          [](const PlanSearch& s) { return bytes_to_mib(s.memory_budget_bytes); },
          [](PlanSearch& s, double mb) { s.memory_budget_bytes = mib_to_bytes(mb); })
      .def_readwrite("state_bytes_per_element", &PlanSearch::state_bytes_per_element)
      .def_readwrite("activation_bytes", &PlanSearch::activation_bytes)
      .def("copy", [](const PlanSearch& s) { return s; })
      .def(
          "check",
          [](const PlanSearch& s, const std::string& who) {
            as_value_error([&] {
              s.check(who);
              return 0;
            });
          },
          py::arg("who") = "PlanSearch");

  py::class_<PlanDecision>(m, "PlanDecision", "What the automatic plan decided")
      .def_readonly("plan", &PlanDecision::plan)
      .def_readonly("changed", &PlanDecision::changed)
      .def("summary", &automatic_plan_dict,
           "net.automatic_plan's dict: the plan, its predicted and replaced steps, the "
           "candidates and what was timed");
}

}  // namespace

void bind_gradient_reducer(py::module_& m) {
  bind_plan(m);
  using Self = std::shared_ptr<TorchReducer>;
  py::class_<TorchReducer, Self>(
      m, "GradientReducer",
      "loom's GradientReducer for loom_torch.parallelize: gradients handed over from autograd "
      "hooks, bucketed and averaged in loom's fixed order on a duplicate of the group's "
      "communicator, released per update group as their buckets land")
      .def(py::init([](ProcessGroupLoom& group, const std::vector<std::string>& names,
                       const std::vector<std::string>& modules,
                       const std::vector<at::Tensor>& parameters, const ReducerPlan& plan,
                       std::optional<bool> profile) {
             py::gil_scoped_release no_gil;
             return std::make_shared<TorchReducer>(group, names, modules, parameters, plan,
                                                   profile);
           }),
           py::arg("group"), py::arg("names"), py::arg("modules"), py::arg("parameters"),
           py::arg("plan"), py::arg("profile"))
      .def(
          "plan", [](TorchReducer& r) { return r.reducer().plan(); }, "The plan in force (a copy)")
      .def("begin", [](TorchReducer& r) { r.reducer().begin(); })
      .def("in_step", [](TorchReducer& r) { return r.reducer().in_step(); })
      .def("ready", &TorchReducer::ready, py::arg("parameter"), py::arg("gradient"),
           py::arg("used") = true)
      .def("mark_unused", &TorchReducer::mark_unused)
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
      .def(
          "release_replaced", [](TorchReducer& r) { r.reducer().release_replaced(); },
          "Frees the memory the last replan replaced (the backward that read it ended)")
      .def("poll", [](TorchReducer& r) { return r.reducer().poll(); })
      .def("wait_update", &TorchReducer::wait_update,
           "Waits for update group k (on NCCL device buckets, until issued: torch's current "
           "stream then waits for the reduction on the device)")
      .def("updated", [](TorchReducer& r, std::size_t k) { r.reducer().updated(k); })
      .def(
          "shard_pieces", [](const Self& r, std::size_t k) { return r->shard_pieces(k, r); },
          py::arg("group"),
          "A sharded plan's pieces of update group k on this rank: (parameter, offset, count, "
          "values, gradient), values and gradient 1-D views of loom's memory")
      .def(
          "parameter_values",
          [](const Self& r, std::size_t p) { return r->parameter_values(p, r); },
          py::arg("parameter"),
          "A sharded plan's parameter p in loom's memory (shaped like p): the parameter is made "
          "a view of it, and each step's all-gathers write it")
      .def(
          "wait_gathered", [](TorchReducer& r, std::size_t k) { r.reducer().wait_gathered(k); },
          py::call_guard<py::gil_scoped_release>())
      .def("gathered", [](TorchReducer& r, std::size_t k) { return r.reducer().gathered(k); })
      .def(
          "gather_order", [](TorchReducer& r) { return r.reducer().gather_order(); },
          "A sharded plan's update groups in the order their all-gathers are issued")
      .def("globally_unused",
           [](TorchReducer& r, std::size_t p) { return r.reducer().globally_unused(p); })
      .def(
          "finish", [](TorchReducer& r) { r.finish(); }, py::call_guard<py::gil_scoped_release>())
      .def("device_buckets", &TorchReducer::device_buckets,
           "Whether the buckets are in device memory (.grad of a CUDA parameter is then its "
           "slot)")
      .def("device_path", &TorchReducer::device_path,
           "How device buckets travel: 'nccl' or 'staged' ('' for host buckets)")
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
      .def(
          "plan_memory",
          [](TorchReducer& r, const ReducerPlan& plan, const PlanSearch& search) {
            const PlanMemory m = plan_memory(r.reducer(), plan, search);
            py::dict d;
            d["parameters_mb"] = bytes_to_mib(m.parameters);
            d["gradients_mb"] = bytes_to_mib(m.gradients);
            d["shards_mb"] = bytes_to_mib(m.shards);
            d["optimizer_state_mb"] = bytes_to_mib(m.optimizer_state);
            d["activations_mb"] = bytes_to_mib(m.activations);
            d["total_mb"] = bytes_to_mib(m.total());
            d["text"] = describe(m);
            return d;
          },
          py::arg("plan"), py::arg("search"),
          "A plan's memory per rank on this reducer's parameters and ranks (every gradient "
          "bucket counted resident), with the search's optimizer state and activations")
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
          [](TorchReducer& r, const ReducerPlan& plan) {
            py::gil_scoped_release no_gil;
            r.replan(plan);
          },
          py::arg("plan"),
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
            return chosen;
          },
          "Collective: rank 0 predicts the candidate plans from its recorded steps and every "
          "rank replans to its fastest")
      .def(
          "shortlist_plans",
          [](TorchReducer& r, const PlanSearch& search) {
            py::gil_scoped_release no_gil;
            return r.shortlist_plans(search);
          },
          py::arg("search"),
          "Collective: rank 0 predicts the candidate plans from its recorded steps and shares "
          "its shortlist (the running plan first), timed one step each in turn, `rounds` "
          "rounds, through trial_step() (None); or, no plan predicted faster than the running "
          "one, keeps it (the decision, a dict)")
      .def(
          "trial_step",
          [](TorchReducer& r, double period_s) {
            py::gil_scoped_release no_gil;
            return r.trial_step(period_s);
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
