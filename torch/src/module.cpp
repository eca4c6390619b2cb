// The Python module loom_torch._C: ProcessGroupLoom as a torch.distributed Backend, and the
// helpers loom_torch/__init__.py needs (launcher rendezvous, failure state).
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/python.h>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "ddp_hook.hpp"
#include "gradient_reducer_binding.hpp"
#include "loom/backend.hpp"
#include "loom/config.hpp"
#include "loom/cuda_device.hpp"
#include "loom/environment.hpp"
#include "loom/error.hpp"
#include "process_group.hpp"

namespace py = pybind11;

namespace {

/// The holder of Python's reference to a group: dropping it releases the GIL first, since the
/// group's destructor joins the progress thread, which may be running a future's Python callback.
template <class T>
class NoGilHolder {
 public:
  NoGilHolder() = default;
  explicit NoGilHolder(T* raw) : _impl(c10::intrusive_ptr<T>::unsafe_reclaim_from_nonowning(raw)) {}
  explicit NoGilHolder(c10::intrusive_ptr<T> impl) : _impl(std::move(impl)) {}
  NoGilHolder(const NoGilHolder&) = default;
  NoGilHolder(NoGilHolder&&) noexcept = default;
  NoGilHolder& operator=(const NoGilHolder&) = default;
  NoGilHolder& operator=(NoGilHolder&&) noexcept = default;
  ~NoGilHolder() {
    if (_impl && PyGILState_Check()) {
      py::gil_scoped_release no_gil;
      _impl.reset();
    }
  }
  T* get() const noexcept { return _impl.get(); }
  T& operator*() const noexcept { return *_impl; }
  T* operator->() const noexcept { return _impl.get(); }

 private:
  c10::intrusive_ptr<T> _impl;
};

}  // namespace

PYBIND11_DECLARE_HOLDER_TYPE(T, NoGilHolder<T>, true);

PYBIND11_MODULE(_C, m) {
  using loom::torch::ProcessGroupLoom;
  m.doc() = "loom's torch.distributed process group (backend \"loom\")";
  // Backend and Store are registered by torch's own extension.
  py::module_::import("torch.distributed");
  m.attr("TORCH_VERSION") = LOOM_TORCH_BUILT_AGAINST;

  py::class_<ProcessGroupLoom, c10d::Backend, NoGilHolder<ProcessGroupLoom>>(
      m, "ProcessGroupLoom",
      "torch.distributed's Backend \"loom\" over a loom Backend; made by "
      "init_process_group(\"loom\") and new_group(backend=\"loom\"); the one behind a group is "
      "loom_torch.backend_of(group)")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::duration<float> timeout, std::vector<int> global_ranks,
                       const std::string& group_name) {
             return NoGilHolder<ProcessGroupLoom>(c10::make_intrusive<ProcessGroupLoom>(
                 store, rank, size, std::chrono::duration_cast<std::chrono::nanoseconds>(timeout),
                 std::move(global_ranks), group_name));
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::arg("global_ranks") = std::vector<int>{}, py::arg("group_name") = "",
           py::call_guard<py::gil_scoped_release>())
      .def("global_ranks", &ProcessGroupLoom::global_ranks,
           "The job's ranks in this group, in group order")
      .def(
          "allreduce_bucket",
          [](ProcessGroupLoom& group, at::Tensor bucket, const std::string& compression) {
            return group.allreduce_bucket(std::move(bucket), loom::parse_compression(compression));
          },
          py::arg("bucket"), py::arg("compression") = "none",
          py::call_guard<py::gil_scoped_release>(),
          "Averages a DDP bucket in place (compression none|float16|bfloat16); returns a Work "
          "whose future completes with [bucket]")
      .def("last_algorithm", &ProcessGroupLoom::last_algorithm,
           "The algorithm the selector chose for the last collective, and why")
      .def("backend_name", &ProcessGroupLoom::backend_name)
      .def("timeout_seconds", &ProcessGroupLoom::timeout_seconds)
      .def("device_path", &ProcessGroupLoom::device_path,
           "How the group's CUDA tensors travel: 'nccl' or 'staged' (through pinned host "
           "memory on the mpi transport); '' before its first CUDA tensor")
      .def("broken", &ProcessGroupLoom::broken)
      .def("flight_record", &ProcessGroupLoom::flight_record, py::arg("reason") = "requested",
           "This rank's flight record as JSON: the group's last operations (collective_seq_id "
           "the same on every rank); a timeout also writes it to LOOM_FLIGHT_RECORDER_DIR");

  m.def(
      "register_ddp_hook",
      [](c10d::Reducer& reducer, ProcessGroupLoom& group, const std::string& compression) {
        reducer.register_comm_hook(std::make_unique<loom::torch::LoomCommHook>(
            c10::intrusive_ptr<ProcessGroupLoom>::reclaim_copy(&group),
            loom::parse_compression(compression)));
      },
      py::arg("reducer"), py::arg("group"), py::arg("compression") = "none",
      "Registers loom's C++ comm hook on a DDP model's reducer (model.reducer)");
  m.def("quiesce_all_groups", &loom::torch::quiesce_all_groups,
        py::call_guard<py::gil_scoped_release>(),
        "Stops every loom group's progress thread (loom_torch's atexit hook): no loom thread "
        "touches a Python object while the interpreter finalises");
  m.def("any_broken", &loom::torch::any_broken,
        "Whether an operation of a loom group timed out in this process");
  m.def(
      "broadcast_from_rank0",
      [](const std::string& text) {
        // Only for the rendezvous before torch has a store: a transient mpi backend.
        auto backend = loom::create_backend("mpi");
        std::string buffer(256, '\0');
        if (backend->rank() == 0) {
          if (text.size() >= buffer.size())
            throw loom::Error(loom::ErrorCode::invalid_argument,
                              "broadcast_from_rank0: text longer than 255 bytes");
          std::memcpy(buffer.data(), text.data(), text.size());
        }
        backend->broadcast(loom::Buffer(buffer.data(), buffer.size(), loom::DType::uint8), 0);
        return std::string(buffer.c_str());
      },
      py::arg("text"), py::call_guard<py::gil_scoped_release>(),
      "Rank 0's text on every rank, over loom's mpi backend (under mpirun only)");
  m.def("launched_by_mpirun", &loom::launched_by_mpirun);
  // The rule a group's first CUDA tensor applies (loom_torch's tests check it without a GPU).
  m.def(
      "_choose_device_path",
      [](std::optional<std::string> wanted, bool have_nccl, bool host_stages, bool nccl_refused) {
        std::optional<loom::torch::DevicePath> want;
        if (wanted == "nccl") want = loom::torch::DevicePath::nccl;
        if (wanted == "staged") want = loom::torch::DevicePath::staged;
        std::string why;
        const auto path =
            loom::torch::choose_device_path(want, have_nccl, host_stages, nccl_refused, why);
        std::optional<std::string> name;
        if (path) name = *path == loom::torch::DevicePath::nccl ? "nccl" : "staged";
        return std::make_pair(name, why);
      },
      py::arg("wanted"), py::arg("have_nccl"), py::arg("host_stages"), py::arg("nccl_refused"));
  // The rule parallelize applies to a CUDA model's buckets (tested without a GPU).
  m.def(
      "_choose_bucket_memory",
      [](std::optional<std::string> wanted, bool have_cuda, bool sharded, int cuda_devices,
         bool cpu_parameters) {
        std::optional<loom::torch::BucketMemory> want;
        if (wanted == "host") want = loom::torch::BucketMemory::host;
        if (wanted == "device") want = loom::torch::BucketMemory::device;
        std::string why;
        const auto memory = loom::torch::choose_bucket_memory(want, have_cuda, sharded,
                                                              cuda_devices, cpu_parameters, why);
        std::optional<std::string> name;
        if (memory) name = *memory == loom::torch::BucketMemory::host ? "host" : "device";
        return std::make_pair(name, why);
      },
      py::arg("wanted"), py::arg("have_cuda"), py::arg("sharded"), py::arg("cuda_devices"),
      py::arg("cpu_parameters"));
  // The ranks' agreement parallelize makes before it opens its companions (tested without a
  // GPU by ranks that pass different choices).
  m.def(
      "_agree_on_bucket_memory",
      [](loom::torch::ProcessGroupLoom& group, const std::string& memory) {
        if (memory != "host" && memory != "device")
          throw py::value_error("memory must be 'host' or 'device', not '" + memory + "'");
        const std::shared_ptr<loom::Backend> backend = group.make_companion_backend();
        py::gil_scoped_release no_gil;
        loom::torch::agree_on_bucket_memory(*backend, memory == "host"
                                                          ? loom::torch::BucketMemory::host
                                                          : loom::torch::BucketMemory::device);
      },
      py::arg("group"), py::arg("memory"));
  m.def("_bucket_memory_from_environment", [] {
    const auto memory = loom::torch::bucket_memory_from_environment();
    return memory ? std::optional<std::string>(memory == loom::torch::BucketMemory::host ? "host"
                                                                                         : "device")
                  : std::nullopt;
  });
  m.def("_device_path_from_environment", [] {
    const auto path = loom::torch::device_path_from_environment();
    return path ? std::optional<std::string>(path == loom::torch::DevicePath::nccl ? "nccl"
                                                                                   : "staged")
                : std::nullopt;
  });
  m.def("_unsafe_skips", [] {
    const auto skips = loom::torch::UnsafeSkips::from_environment();
    return std::make_pair(skips.stream_wait, skips.input_hold);
  });
  m.def("cuda_built", &loom::cuda::built_with_cuda,
        "Whether the loom under this package was built with CUDA (its staging and NCCL paths)");
  m.def(
      "nccl_built", [] { return LOOM_HAVE_NCCL != 0; },
      "Whether the loom under this package was built with NCCL");
  m.def(
      "transports",
      [] {
        std::vector<std::string> names;
        if (LOOM_HAVE_MPI) names.emplace_back("mpi");
        if (LOOM_HAVE_UCX) names.emplace_back("ucx");
        return names;
      },
      "The transports between processes this package was built with: mpi (Open MPI, under "
      "mpirun) and ucx (through torch's store, under any launcher)");
  // The launcher's rank, size and local rank as loom reads them (None without a launcher, or
  // where a value is not a count): one parser for C++ and Python.
  m.def("launcher_rank", &loom::environment::launcher_rank);
  m.def("launcher_world_size", &loom::environment::launcher_world_size);
  m.def("launcher_local_rank", &loom::environment::launcher_local_rank);
  loom::torch::bind_gradient_reducer(m);
}
