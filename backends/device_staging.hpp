// DeviceStaging: device buffers through a transport that cannot take them (an MPI that is not
// CUDA-aware, ucx), by way of pinned host memory, chunked and pipelined (device-to-host of chunk
// k+1 while the transport moves chunk k, and host-to-device of chunk k as soon as it is done
// with it). CUDA builds only.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "loom/buffer.hpp"
#include "loom/cuda_stream.hpp"
#include "loom/pinned_pool.hpp"
#include "loom/work.hpp"

namespace loom {

/// @brief Starts the host operation on one chunk: `in` holds the chunk's input (already on the
/// host), `out` receives its output (may be the same memory as `in`).
using StartChunk = std::function<std::unique_ptr<Work>(Buffer in, Buffer out)>;

/// @brief What to stage: the device input (empty if none: recv, or broadcast off the root), the
/// device output (empty if none: send, reduce off the root), whether the host operation may
/// be split element-wise into chunks, and whether it works in place (`in` == `out`).
struct StagingRequest {
  std::string description;
  Buffer device_in;
  Buffer device_out;
  bool chunked = true;
  bool in_place = false;
  StartChunk start_chunk;
};

/// @brief One per backend that stages: its pinned pool (cudaHostAlloc) and per-device copy
/// streams.
class DeviceStaging {
 public:
  /// @brief `input_stream`: device inputs are read after the work enqueued on it so far.
  DeviceStaging(std::size_t chunk_bytes, cuda::NativeStream input_stream);
  ~DeviceStaging();

  /// @brief Issues every chunk's host operation, in chunk order, before returning (so the
  /// order of the transport's calls is the caller's order on every rank); the returned Work
  /// finishes when the last output chunk is back on the device. The caller thread waits only for
  /// each chunk's device-to-host copy, which overlaps with the transport moving the chunk before
  /// it.
  std::unique_ptr<Work> run(StagingRequest request);

  std::size_t chunk_bytes() const noexcept { return _chunk_bytes; }

 private:
  struct Streams {
    cuda::Stream down;
    cuda::Stream up;
    cuda::Event input_ready;  // recorded on the input stream, waited for by `down`
  };
  Streams& streams(int device);

  std::size_t _chunk_bytes;
  cuda::NativeStream _input_stream;
  std::shared_ptr<PinnedPool> _pool;
  std::mutex _mutex;
  std::map<int, std::unique_ptr<Streams>> _streams;
};

}  // namespace loom
