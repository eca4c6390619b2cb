// CUDA kernels: reduction (every DType x ReduceOp), average, scale, dtype casts and bucket
// pack/unpack, each enqueued on a caller's stream. Pointers are device (or managed) memory.
// Only in a build with CUDA (LOOM_HAVE_CUDA); the semantics are those of the CPU kernels.
#pragma once

#include <cstddef>
#include <memory>

#include "loom/cuda_stream.hpp"
#include "loom/dtype.hpp"
#include "loom/kernels/pack.hpp"

namespace loom::kernels::cuda {

using loom::cuda::NativeStream;

/// @brief out[i] = a[i] (op) b[i] on `stream`, exactly as kernels::reduce on the CPU (same
/// rounding for float16/bfloat16, NaN propagation for min/max, wrapping integers), so the
/// results are equal bit for bit. avg combines as sum. Throws loom::Error where
/// supports(op, dtype) is false.
void reduce(void* out, const void* a, const void* b, std::size_t count, DType dtype, ReduceOp op,
            NativeStream stream);

/// @brief data[i] /= divisor on `stream`, as kernels::average (integers truncate toward zero;
/// bool refused).
void average(void* data, std::size_t count, DType dtype, int divisor, NativeStream stream);

/// @brief data[i] *= factor on `stream` (floating and complex dtypes), as kernels::scale.
void scale(void* data, std::size_t count, DType dtype, double factor, NativeStream stream);
/// @brief out[i] = in[i] * factor on `stream` (out may alias in), as kernels::scale(in, out):
/// a gradient copied into its bucket and divided by the world size in one pass.
void scale(const void* in, void* out, std::size_t count, DType dtype, double factor,
           NativeStream stream);

/// @brief Converts between float32, float16 and bfloat16 on `stream`, as kernels::cast.
void cast(const void* in, DType from, void* out, DType to, std::size_t count, NativeStream stream);
/// @brief The same with `factor` multiplied in (in float) in the same pass, as kernels::cast
/// with a factor: the compression hook's cast with the average folded in.
void cast(const void* in, DType from, void* out, DType to, std::size_t count, double factor,
          NativeStream stream);

/// @brief A PackPlan uploaded to one device: packing or unpacking every segment of a bucket is
/// then one kernel launch (one thread block per piece), whatever the number of segments.
class DevicePackPlan {
 public:
  /// @brief Uploads `plan`'s pieces (at most `max_piece_bytes` each) to `device`; the segments
  /// must be device memory of that device and stay valid while this plan is used.
  DevicePackPlan(const PackPlan& plan, int device, std::size_t max_piece_bytes = 64 * 1024);
  ~DevicePackPlan();
  DevicePackPlan(DevicePackPlan&&) noexcept;
  DevicePackPlan& operator=(DevicePackPlan&&) noexcept;

  const PackPlan& plan() const noexcept;
  std::size_t piece_count() const noexcept;

  /// @brief Copies every segment into `flat` (device memory of plan().flat_bytes()) on `stream`.
  void pack(void* flat, NativeStream stream) const;
  /// @brief Copies every segment back out of `flat` on `stream`.
  void unpack(const void* flat, NativeStream stream) const;

 private:
  struct State;
  std::unique_ptr<State> _state;
};

}  // namespace loom::kernels::cuda
