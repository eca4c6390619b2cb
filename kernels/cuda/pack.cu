// DevicePackPlan: a bucket's pack/unpack as one kernel launch. Each thread block copies one
// piece, with 16-byte loads when the piece's addresses and size allow it, else bytes.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda_check.hpp"
#include "loom/cuda_device.hpp"
#include "loom/error.hpp"
#include "loom/kernels/cuda.hpp"

namespace loom::kernels::cuda {

using loom::cuda::check;

namespace {

// One piece as the kernel sees it: the segment's bytes and where they sit in the flat buffer.
struct DevicePiece {
  std::byte* segment;
  std::size_t flat_offset;
  std::size_t bytes;
};

__device__ void copy_bytes(std::byte* to, const std::byte* from, std::size_t bytes) {
  const auto aligned = [](const void* p) {
    return (reinterpret_cast<std::uintptr_t>(p) & 15) == 0;
  };
  if (aligned(to) && aligned(from) && (bytes & 15) == 0) {
    auto* t = reinterpret_cast<uint4*>(to);
    auto* f = reinterpret_cast<const uint4*>(from);
    for (std::size_t i = threadIdx.x; i < bytes / 16; i += blockDim.x) t[i] = f[i];
  } else {
    for (std::size_t i = threadIdx.x; i < bytes; i += blockDim.x) to[i] = from[i];
  }
}

__global__ void pack_kernel(const DevicePiece* pieces, std::byte* flat) {
  const DevicePiece p = pieces[blockIdx.x];
  copy_bytes(flat + p.flat_offset, p.segment, p.bytes);
}

__global__ void unpack_kernel(const DevicePiece* pieces, const std::byte* flat) {
  const DevicePiece p = pieces[blockIdx.x];
  copy_bytes(p.segment, flat + p.flat_offset, p.bytes);
}

constexpr unsigned threads_per_block = 256;

}  // namespace

struct DevicePackPlan::State {
  PackPlan plan;
  loom::cuda::DeviceMemory pieces;
  std::size_t piece_count = 0;
  int device = 0;
};

DevicePackPlan::DevicePackPlan(const PackPlan& plan, int device, std::size_t max_piece_bytes)
    : _state(std::make_unique<State>()) {
  _state->plan = plan;
  _state->device = device;
  std::vector<DevicePiece> pieces;
  for (const PackPiece& p : plan.pieces(max_piece_bytes))
    pieces.push_back({static_cast<std::byte*>(plan.segments()[p.segment].data) + p.segment_offset,
                      p.flat_offset, p.bytes});
  if (pieces.size() > 0x7fffffffu)
    throw Error(ErrorCode::invalid_argument,
                "device pack plan: " + std::to_string(pieces.size()) +
                    " pieces exceed one launch's grid; use larger pieces");
  _state->piece_count = pieces.size();
  _state->pieces = loom::cuda::DeviceMemory(pieces.size() * sizeof(DevicePiece), device);
  loom::cuda::copy(_state->pieces.data(), pieces.data(), pieces.size() * sizeof(DevicePiece));
}

DevicePackPlan::~DevicePackPlan() = default;
DevicePackPlan::DevicePackPlan(DevicePackPlan&&) noexcept = default;
DevicePackPlan& DevicePackPlan::operator=(DevicePackPlan&&) noexcept = default;

const PackPlan& DevicePackPlan::plan() const noexcept {
  return _state->plan;
}
std::size_t DevicePackPlan::piece_count() const noexcept {
  return _state->piece_count;
}

void DevicePackPlan::pack(void* flat, NativeStream stream) const {
  if (_state->piece_count == 0) return;
  pack_kernel<<<static_cast<unsigned>(_state->piece_count), threads_per_block, 0, stream>>>(
      static_cast<const DevicePiece*>(_state->pieces.data()), static_cast<std::byte*>(flat));
  check(cudaGetLastError(), "launch of pack over " + std::to_string(_state->piece_count) +
                                " pieces (" + std::to_string(_state->plan.flat_bytes()) +
                                " bytes)");
}

void DevicePackPlan::unpack(const void* flat, NativeStream stream) const {
  if (_state->piece_count == 0) return;
  unpack_kernel<<<static_cast<unsigned>(_state->piece_count), threads_per_block, 0, stream>>>(
      static_cast<const DevicePiece*>(_state->pieces.data()), static_cast<const std::byte*>(flat));
  check(cudaGetLastError(), "launch of unpack over " + std::to_string(_state->piece_count) +
                                " pieces (" + std::to_string(_state->plan.flat_bytes()) +
                                " bytes)");
}

}  // namespace loom::kernels::cuda
