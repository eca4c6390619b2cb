// Staging device buffers through pinned host memory for a transport that cannot take them.
#include "device_staging.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "cuda_check.hpp"
#include "loom/cuda_device.hpp"
#include "loom/error.hpp"

namespace loom {
namespace {

// One chunk: its host views, its device output slice and where it is in the pipeline.
struct Chunk {
  Buffer host_in, host_out, device_out;
  std::unique_ptr<Work> host;             // the transport's operation on the host views
  std::unique_ptr<cuda::Event> uploaded;  // behind the host-to-device copy
  bool upload_issued = false;
};

class StagedWork final : public Work {
 public:
  StagedWork(std::string description, std::vector<Chunk> chunks, PinnedBlock in_block,
             PinnedBlock out_block, cuda::NativeStream up, int device)
      : Work(std::move(description)),
        _chunks(std::move(chunks)),
        _in_block(std::move(in_block)),
        _out_block(std::move(out_block)),
        _up(up),
        _device(device) {}

  // The pinned blocks must outlive every copy and host operation that uses them.
  ~StagedWork() override {
    for (Chunk& c : _chunks) {
      c.host.reset();  // a host Work's destructor waits for (or cancels) its request
      if (c.upload_issued && c.uploaded) {
        try {
          c.uploaded->synchronize();
        } catch (const Error&) {
          // The device failed; nothing more can be done for this copy.
        }
      }
    }
  }

 protected:
  bool poll() override {
    bool all_done = true;
    for (Chunk& c : _chunks) {
      if (!c.upload_issued) {
        if (!c.host->test()) {
          all_done = false;
          continue;  // later chunks may finish first: their uploads need not wait
        }
        if (c.host->failed()) std::rethrow_exception(c.host->error());
        if (!c.device_out.empty()) {
          cuda::DeviceGuard guard(_device);
          cuda::check(cudaMemcpyAsync(c.device_out.data(), c.host_out.data(), c.host_out.bytes(),
                                      cudaMemcpyDefault, _up),
                      description() + ": host-to-device copy of " +
                          std::to_string(c.host_out.bytes()) + " bytes");
          c.uploaded = std::make_unique<cuda::Event>(_device);
          c.uploaded->record(_up);
        }
        c.upload_issued = true;
      }
      if (c.uploaded && !c.uploaded->complete()) all_done = false;
    }
    return all_done;
  }

 private:
  std::vector<Chunk> _chunks;
  PinnedBlock _in_block, _out_block;
  cuda::NativeStream _up;
  int _device;
};

// A staged buffer's memory must be where its label says: cudaMemcpyDefault would copy host
// memory labelled cuda:N without complaint, and the operation would run on the wrong data.
void check_label(const std::string& description, const char* which, Buffer buffer) {
  if (buffer.empty()) return;
  auto mislabelled = [&](const std::string& what) {
    return Error(ErrorCode::invalid_argument, description + ": the " + which +
                                                  " buffer is labelled " +
                                                  to_string(buffer.device()) + " but " + what);
  };
  cudaPointerAttributes attributes{};
  const cudaError_t status = cudaPointerGetAttributes(&attributes, buffer.data());
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw mislabelled("CUDA does not know its memory (" + cuda::error_text(status) + ")");
  }
  if (attributes.type == cudaMemoryTypeManaged) return;
  if (attributes.type != cudaMemoryTypeDevice)
    throw mislabelled("holds host memory (cudaPointerGetAttributes); label it Device::cpu()");
  if (attributes.device != buffer.device().index)
    throw mislabelled("holds memory of " + to_string(Device::cuda(attributes.device)));
}

}  // namespace

DeviceStaging::DeviceStaging(std::size_t chunk_bytes, cuda::NativeStream input_stream)
    : _chunk_bytes(std::max<std::size_t>(chunk_bytes, 4096)),
      _input_stream(input_stream),
      _pool(std::make_shared<PinnedPool>()) {}

DeviceStaging::~DeviceStaging() = default;

DeviceStaging::Streams& DeviceStaging::streams(int device) {
  std::lock_guard lock(_mutex);
  auto& slot = _streams[device];
  if (!slot)
    slot = std::make_unique<Streams>(Streams{cuda::Stream(device, cuda::Stream::Priority::high),
                                             cuda::Stream(device), cuda::Event(device)});
  return *slot;
}

std::unique_ptr<Work> DeviceStaging::run(StagingRequest r) {
  const Buffer shape = r.device_in.empty() ? r.device_out : r.device_in;
  const int device = shape.device().index;
  cuda::require_device(device);
  check_label(r.description, "send", r.device_in);
  check_label(r.description, "recv", r.device_out);
  Streams& s = streams(device);
  const std::size_t element = dtype_size(shape.dtype());
  const std::size_t in_count = r.device_in.count(), out_count = r.device_out.count();

  // In place (allreduce, broadcast) the chunk is read and written in one pinned block.
  const std::size_t total = std::max(in_count, out_count);
  PinnedBlock in_block = _pool->acquire((r.in_place ? total : in_count) * element);
  PinnedBlock out_block = r.in_place ? PinnedBlock() : _pool->acquire(out_count * element);
  const Buffer host_in(in_block.data(), r.in_place ? total : in_count, shape.dtype());
  const Buffer host_out = r.in_place ? host_in : Buffer(out_block.data(), out_count, shape.dtype());

  // Chunk boundaries in elements; an unchunked operation is one chunk of everything.
  const std::size_t per_chunk = r.chunked ? std::max<std::size_t>(1, _chunk_bytes / element)
                                          : std::max<std::size_t>(total, 1);
  std::vector<Chunk> chunks;
  for (std::size_t start = 0; start < std::max<std::size_t>(total, 1); start += per_chunk) {
    const std::size_t n = std::min(per_chunk, total - std::min(total, start));
    auto piece = [&](Buffer b) { return !r.chunked || b.count() == 0 ? b : b.slice(start, n); };
    Chunk c;
    c.host_in = piece(host_in);
    c.host_out = piece(host_out);
    c.device_out = piece(r.device_out);
    chunks.push_back(std::move(c));
  }

  // Every device-to-host copy is queued at once; the copy engine runs them back to back while
  // the loop below hands each finished chunk to the transport.
  std::vector<std::unique_ptr<cuda::Event>> downloaded;
  cuda::DeviceGuard guard(device);
  try {
    // The copy streams are non-blocking: without these waits they could read the input before
    // the kernel or copy that produces it (on the input stream) has finished, or write the
    // output before an earlier write there lands on top of it (a cudaMemcpy from pageable
    // memory returns before its DMA is done: a broadcast's result was overwritten by the
    // receiver's own initial values, seen on an H200).
    if (!r.device_in.empty() || !r.device_out.empty()) s.input_ready.record(_input_stream);
    if (!r.device_out.empty()) s.up.wait(s.input_ready);
    if (!r.device_in.empty()) {
      s.down.wait(s.input_ready);
      std::size_t offset = 0;
      for (Chunk& c : chunks) {
        const std::size_t bytes = c.host_in.bytes();
        cuda::check(cudaMemcpyAsync(c.host_in.data(),
                                    static_cast<const std::byte*>(r.device_in.data()) + offset,
                                    bytes, cudaMemcpyDefault, s.down.native()),
                    r.description + ": device-to-host copy of " + std::to_string(bytes) + " bytes");
        offset += bytes;
        downloaded.push_back(std::make_unique<cuda::Event>(device));
        downloaded.back()->record(s.down);
      }
    }
    for (std::size_t k = 0; k < chunks.size(); ++k) {
      if (!downloaded.empty()) {
        // Poll the copy (and earlier chunks' host operations, so they progress meanwhile).
        for (auto pause = std::chrono::microseconds(1); !downloaded[k]->complete();
             pause = std::min(pause * 2, std::chrono::microseconds(100))) {
          for (std::size_t j = 0; j < k; ++j) chunks[j].host->test();
          std::this_thread::sleep_for(pause);
        }
      }
      chunks[k].host = r.start_chunk(chunks[k].host_in, chunks[k].host_out);
    }
  } catch (...) {
    // Copies may still be writing into the pinned blocks about to go back to the pool.
    try {
      s.down.synchronize();
    } catch (const Error&) {
      // The device failed too; the original error is the one to report.
    }
    throw;
  }
  return std::make_unique<StagedWork>(std::move(r.description), std::move(chunks),
                                      std::move(in_block), std::move(out_block), s.up.native(),
                                      device);
}

}  // namespace loom
