// Ordering loom's device work after torch's current stream, and choosing a CUDA tensor's path.
#include "device_order.hpp"

#include <c10/core/Stream.h>

#include <c10/core/impl/VirtualGuardImpl.h>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "loom/cuda_device.hpp"
#include "loom/environment.hpp"
#include "loom/error.hpp"

namespace loom::torch {

namespace {

// A variable that is unset, empty or "auto" (nullopt), or one of `choices` by name; anything
// else is ErrorCode::invalid_argument naming the value and the names it may take.
template <class T>
std::optional<T> auto_or_one_of(const char* variable,
                                std::initializer_list<std::pair<std::string_view, T>> choices) {
  const auto text = environment::text(variable);
  if (!text || text->empty() || *text == "auto") return std::nullopt;
  std::string names = "auto";
  for (const auto& [name, value] : choices) {
    if (*text == name) return value;
    names += ", " + std::string(name);
  }
  throw Error(ErrorCode::invalid_argument,
              std::string(variable) + "='" + *text + "': expected one of " + names);
}

}  // namespace

std::optional<DevicePath> device_path_from_environment() {
  return auto_or_one_of<DevicePath>("LOOM_TORCH_CUDA_PATH",
                                    {{"nccl", DevicePath::nccl}, {"staged", DevicePath::staged}});
}

std::optional<DevicePath> choose_device_path(std::optional<DevicePath> wanted, bool have_nccl,
                                             bool host_stages, bool nccl_refused,
                                             std::string& why) {
  why.clear();
  const std::string staged_missing =
      "staging through pinned memory needs loom's mpi or ucx transport built with CUDA";
  if (wanted == DevicePath::nccl) {
    if (!have_nccl) {
      why = "LOOM_TORCH_CUDA_PATH=nccl, but this loom_torch was built without NCCL";
      return std::nullopt;
    }
    if (nccl_refused) {
      why =
          "LOOM_TORCH_CUDA_PATH=nccl, but NCCL refused the group (two ranks on one GPU); "
          "unset it to stage through pinned memory";
      return std::nullopt;
    }
    return DevicePath::nccl;
  }
  if (wanted == DevicePath::staged) {
    if (!host_stages) {
      why = "LOOM_TORCH_CUDA_PATH=staged: " + staged_missing;
      return std::nullopt;
    }
    return DevicePath::staged;
  }
  if (have_nccl && !nccl_refused) return DevicePath::nccl;
  if (host_stages) return DevicePath::staged;
  why = std::string(have_nccl ? "NCCL refused the group (two ranks on one GPU)"
                              : "this loom_torch was built without NCCL") +
        ", and " + staged_missing;
  return std::nullopt;
}

std::optional<BucketMemory> bucket_memory_from_environment() {
  return auto_or_one_of<BucketMemory>(
      "LOOM_TORCH_CUDA_BUCKETS", {{"host", BucketMemory::host}, {"device", BucketMemory::device}});
}

std::optional<BucketMemory> choose_bucket_memory(std::optional<BucketMemory> wanted, bool have_cuda,
                                                 bool sharded, int cuda_devices,
                                                 bool cpu_parameters, std::string& why) {
  why.clear();
  if (cuda_devices == 0 || wanted == BucketMemory::host) return BucketMemory::host;
  std::string against;
  if (!have_cuda)
    against = "this loom_torch was built without CUDA";
  else if (sharded)
    against = "a sharded plan keeps the parameters in host memory";
  else if (cuda_devices > 1)
    against = "the parameters are on " + std::to_string(cuda_devices) + " GPUs (one per process)";
  else if (cpu_parameters)
    against = "some parameters are on the CPU";
  if (against.empty()) return BucketMemory::device;
  if (!wanted) return BucketMemory::host;
  why = "LOOM_TORCH_CUDA_BUCKETS=device, but " + against;
  return std::nullopt;
}

void agree_on_bucket_memory(Backend& backend, BucketMemory memory) {
  std::int32_t on_device = memory == BucketMemory::device ? 1 : 0;
  backend.allreduce(Buffer(&on_device, 1, DType::int32), ReduceOp::sum);
  const int world = backend.world_size();
  if (on_device == 0 || on_device == world) return;
  throw Error(ErrorCode::mismatch,
              "parallelize: the ranks disagree on where a CUDA model's buckets live: " +
                  std::to_string(on_device) + " of " + std::to_string(world) +
                  " ranks chose device memory, the others host memory (rank " +
                  std::to_string(backend.rank()) + ": " +
                  (memory == BucketMemory::device ? "device" : "host") +
                  "); LOOM_TORCH_CUDA_BUCKETS and the trained parameters' devices must be the "
                  "same on every rank");
}

UnsafeSkips UnsafeSkips::from_environment() {
  UnsafeSkips skips;
  const auto text = environment::text("LOOM_TORCH_UNSAFE_SKIP");
  if (!text || text->empty()) return skips;
  std::string_view rest = *text;
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    const std::string_view word = rest.substr(0, comma);
    if (word == "stream_wait")
      skips.stream_wait = true;
    else if (word == "input_hold")
      skips.input_hold = true;
    else if (!word.empty())
      throw Error(ErrorCode::invalid_argument, "LOOM_TORCH_UNSAFE_SKIP='" + *text + "': '" +
                                                   std::string(word) +
                                                   "' is not one of stream_wait, input_hold");
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
  return skips;
}

cuda::NativeStream DeviceOrder::stream(int device, std::string_view where) {
  std::lock_guard lock(_mutex);
  if (_device >= 0 && device != _device)
    throw Error(ErrorCode::invalid_argument,
                std::string(where) + ": a tensor on cuda:" + std::to_string(device) +
                    ", but this group's CUDA tensors are on cuda:" + std::to_string(_device) +
                    " (one device per process and group: torch.cuda.set_device(LOCAL_RANK) "
                    "before init_process_group)");
  if (!_stream) {
    const cuda::DeviceGuard guard(device);  // the caller's current device is left as it was
    _stream = std::make_unique<cuda::Stream>(device, cuda::Stream::Priority::high);
    _event = std::make_unique<cuda::Event>(device);
    _device = device;
  }
  return _stream->native();
}

void DeviceOrder::after_current(const at::Tensor& tensor, std::string_view where) {
  const c10::Device device = tensor.device();
  stream(device.index(), where);
  if (_skips.stream_wait) return;
  // torch's current stream on that device, through c10's device-generic interface (no link
  // to libc10_cuda: the same extension builds against torch's CPU and CUDA wheels).
  const c10::impl::VirtualGuardImpl guard(device.type());
  const c10::Stream current = guard.getStream(device);
  std::lock_guard lock(_mutex);
  _event->record(static_cast<cuda::NativeStream>(current.native_handle()));
  _stream->wait(*_event);
}

void DeviceOrder::current_after(std::string_view where) {
  const int device = this->device();
  if (device < 0)
    throw Error(ErrorCode::internal,
                std::string(where) + ": no stream yet to order torch's current stream after");
  if (_skips.stream_wait) return;
  const c10::Device torch_device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device));
  const c10::impl::VirtualGuardImpl guard(torch_device.type());
  const c10::Stream current = guard.getStream(torch_device);
  std::lock_guard lock(_mutex);
  _event->record(*_stream);
  cuda::stream_wait(static_cast<cuda::NativeStream>(current.native_handle()), *_event);
}

int DeviceOrder::device() const {
  std::lock_guard lock(_mutex);
  return _device;
}

}  // namespace loom::torch
