// DeviceOrder: loom's device work ordered after torch's current stream, and the device a torch
// group's CUDA tensors travel on.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "loom/backend.hpp"
#include "loom/cuda_stream.hpp"

namespace loom::torch {

/// @brief How a CUDA tensor travels through a torch group: on NCCL (one rank per GPU), or
/// staged through pinned host memory on the group's host transport (mpi or ucx; any number of
/// ranks per GPU).
enum class DevicePath { nccl, staged };

/// @brief LOOM_TORCH_CUDA_PATH: "nccl", "staged", or unset/"auto" (nullopt: NCCL where loom
/// has it and every rank has a GPU of its own, else staged). Anything else is
/// ErrorCode::invalid_argument naming the value.
std::optional<DevicePath> device_path_from_environment();

/// @brief The path a group's CUDA tensors take, or "" and the reason in `why` when none can:
/// `wanted` (nullopt: automatic), whether this loom has NCCL, whether the group's host
/// transport stages device buffers (mpi and ucx do in CUDA builds), and whether NCCL refused the
/// group (two ranks on one GPU: NCCL's own refusal, found by trying).
std::optional<DevicePath> choose_device_path(std::optional<DevicePath> wanted, bool have_nccl,
                                             bool host_stages, bool nccl_refused, std::string& why);

/// @brief Where parallelize's buckets of a CUDA model live: host memory (each gradient
/// staged through its slot there, as DDP on Gloo) or device memory of the parameters' GPU
/// (loom's CUDA kernels pack and scale, the collective moves device memory).
enum class BucketMemory { host, device };

/// @brief LOOM_TORCH_CUDA_BUCKETS: "host", "device", or unset/"auto" (nullopt). Anything else
/// is ErrorCode::invalid_argument naming the value.
std::optional<BucketMemory> bucket_memory_from_environment();

/// @brief Where parallelize buckets a model: `cuda_devices` the distinct CUDA devices of its
/// trained parameters, `cpu_parameters` whether some are on the CPU. Automatic: device memory
/// where loom has CUDA, the plan is unsharded and every parameter is on one GPU; host memory
/// otherwise. nullopt and the reason in `why` where `wanted` is device memory and it cannot be.
std::optional<BucketMemory> choose_bucket_memory(std::optional<BucketMemory> wanted, bool have_cuda,
                                                 bool sharded, int cuda_devices,
                                                 bool cpu_parameters, std::string& why);

/// @brief Every rank must bucket alike (their companions are opened to match): an allreduce
/// over `backend` (with its timeout) of how many ranks chose device memory. Where they differ,
/// ErrorCode::mismatch on every rank, naming the count and this rank's choice.
void agree_on_bucket_memory(Backend& backend, BucketMemory memory);

/// @brief What loom_torch's stream-order safeguards skip, for the test that proves each one
/// matters (LOOM_TORCH_UNSAFE_SKIP=stream_wait|input_hold); never set in a real job.
struct UnsafeSkips {
  bool stream_wait = false;  // loom's stream does not wait for torch's current stream
  bool input_hold = false;   // inputs are not kept alive while loom reads them
  static UnsafeSkips from_environment();
};

/// @brief The stream a group's device operations are ordered on (one per group, on the device
/// of its first CUDA tensor): before each operation, an event recorded on torch's current
/// stream of that device, which loom's stream waits for on the device (no host wait). The
/// backend that moves the group's CUDA tensors reads and writes them after that stream.
class DeviceOrder {
 public:
  DeviceOrder() = default;

  /// @brief The group's stream on `device`, made on first use. A second device is
  /// ErrorCode::invalid_argument naming both (one device per process and group).
  cuda::NativeStream stream(int device, std::string_view where);

  /// @brief Makes the group's stream wait for the work torch's current stream of the tensor's
  /// device has enqueued so far (unless UnsafeSkips::stream_wait).
  void after_current(const at::Tensor& tensor, std::string_view where);

  /// @brief Makes torch's current stream of the group's device wait (on the device, no host
  /// wait) for the work enqueued on the group's stream so far (unless UnsafeSkips::stream_wait).
  void current_after(std::string_view where);

  /// @brief The device of the group's stream; -1 before the first CUDA tensor.
  int device() const;
  const UnsafeSkips& skips() const noexcept { return _skips; }

 private:
  mutable std::mutex _mutex;
  int _device = -1;
  std::unique_ptr<cuda::Stream> _stream;
  std::unique_ptr<cuda::Event> _event;
  UnsafeSkips _skips = UnsafeSkips::from_environment();
};

}  // namespace loom::torch
