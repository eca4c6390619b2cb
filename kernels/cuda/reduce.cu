// CUDA reduction, average, scale and cast kernels: grid-stride loops that compute exactly what
// kernels/cpu computes (16-bit floats through float with the shared rounding of half_bits.hpp).
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda_check.hpp"
#include "half_bits.hpp"
#include "loom/error.hpp"
#include "loom/kernels/cast.hpp"
#include "loom/kernels/cuda.hpp"

namespace loom::kernels::cuda {

using loom::cuda::check;

namespace {

// Storage types on the device: 16-bit floats are raw bits tagged by a kind.
struct Half {
  std::uint16_t bits;
};
struct BHalf {
  std::uint16_t bits;
};
// torch.bool: one byte; reduced logically (bool_reduce_kernel), never divided or scaled.
struct Bool {
  std::uint8_t value;
};

template <class T>
struct Arith {  // how an element is computed with
  using type = T;
  __device__ static T load(T v) { return v; }
  __device__ static T store(T v) { return v; }
};
template <>
struct Arith<Half> {
  using type = float;
  __device__ static float load(Half v) { return half_bits::float16_to_float(v.bits); }
  __device__ static Half store(float v) { return {half_bits::float_to_float16(v)}; }
};
template <>
struct Arith<BHalf> {
  using type = float;
  __device__ static float load(BHalf v) { return half_bits::bfloat16_to_float(v.bits); }
  __device__ static BHalf store(float v) { return {half_bits::float_to_bfloat16(v)}; }
};

// The operators of kernels/cpu/reduce.cpp: NaN wins in min/max; integers wrap (unsigned math).
template <class U>
__device__ U combine(U a, U b, ReduceOp op) {
  if constexpr (std::is_integral_v<U>) {
    // Unsigned arithmetic wraps; narrower than unsigned int, in unsigned int (a uint16_t
    // product would be promoted to a signed int and could overflow).
    using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, std::make_unsigned_t<U>>;
    switch (op) {
      case ReduceOp::prod:
        return static_cast<U>(static_cast<W>(static_cast<W>(a) * static_cast<W>(b)));
      case ReduceOp::min:
        return b < a ? b : a;
      case ReduceOp::max:
        return a < b ? b : a;
      default:
        return static_cast<U>(static_cast<W>(static_cast<W>(a) + static_cast<W>(b)));
    }
  } else {
    switch (op) {
      case ReduceOp::prod:
        return a * b;
      case ReduceOp::min:
        if (b != b) return b;
        return b < a ? b : a;
      case ReduceOp::max:
        if (b != b) return b;
        return a < b ? b : a;
      default:
        return a + b;
    }
  }
}

template <class T>
__global__ void reduce_kernel(T* out, const T* a, const T* b, std::size_t n, ReduceOp op) {
  using A = Arith<T>;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    out[i] = A::store(combine(A::load(a[i]), A::load(b[i]), op));
}

// As kernels/cpu: sum and max are logical or, prod and min logical and; results are 0 or 1.
__global__ void bool_reduce_kernel(Bool* out, const Bool* a, const Bool* b, std::size_t n,
                                   ReduceOp op) {
  const bool any = op == ReduceOp::sum || op == ReduceOp::max;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const bool x = a[i].value != 0, y = b[i].value != 0;
    out[i].value = static_cast<std::uint8_t>(any ? (x || y) : (x && y));
  }
}

// Integers (avg as ncclAvg): the quotient truncates toward zero, C++'s integer division; int8
// and int16 divide as int.
template <class T>
__global__ void divide_kernel(T* data, std::size_t n, int divisor) {
  using A = Arith<T>;
  using U = typename A::type;
  const U d = static_cast<U>(divisor);
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    data[i] = A::store(A::load(data[i]) / d);
}

// As the CPU: multiply by the factor in the type an element computes in (float for 16-bit
// floats, then rounded to 16 bits).
template <class T>
__global__ void scale_kernel(const T* in, T* out, std::size_t n, double factor) {
  using A = Arith<T>;
  using U = typename A::type;
  const U f = static_cast<U>(factor);
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    out[i] = A::store(A::load(in[i]) * f);
}

// As the CPU's cast: through float, the factor (1 for a plain cast) multiplied in float.
template <class From, class To>
__global__ void cast_kernel(const From* in, To* out, std::size_t n, float factor) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    out[i] = Arith<To>::store(static_cast<float>(Arith<From>::load(in[i])) * factor);
}

constexpr unsigned threads_per_block = 256;

// Enough blocks to fill an H100 several times over; the grid-stride loop covers the rest.
unsigned blocks_for(std::size_t n) {
  const std::size_t wanted = (n + threads_per_block - 1) / threads_per_block;
  return static_cast<unsigned>(wanted < 65535 ? wanted : 65535);
}

void check_launch(const char* kernel, std::size_t n, DType dtype) {
  check(cudaGetLastError(), std::string("launch of ") + kernel + " on " + std::to_string(n) + " " +
                                std::string(to_string(dtype)) + " elements");
}

// Calls fn(T{}) with the device storage type of `dtype`; complex types are their real halves
// (the callers pass elements(count, dtype) elements).
template <class Fn>
void with_type(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::float32:
      return fn(float{});
    case DType::float64:
      return fn(double{});
    case DType::float16:
      return fn(Half{});
    case DType::bfloat16:
      return fn(BHalf{});
    case DType::int32:
      return fn(std::int32_t{});
    case DType::int64:
      return fn(std::int64_t{});
    case DType::uint8:
      return fn(std::uint8_t{});
    case DType::int8:
      return fn(std::int8_t{});
    case DType::int16:
      return fn(std::int16_t{});
    case DType::boolean:
      return fn(Bool{});
    case DType::complex64:
      return fn(float{});
    case DType::complex128:
      return fn(double{});
  }
}

// The number of storage elements with_type's T covers: a complex number is two.
std::size_t elements(std::size_t count, DType dtype) {
  return is_complex(dtype) ? 2 * count : count;
}

void require_scalable(const char* what, DType dtype) {
  if (!is_floating(dtype) && !is_complex(dtype))
    throw Error(ErrorCode::unsupported, std::string(what) + " is not defined for " +
                                            std::string(to_string(dtype)) +
                                            " (a scale factor is applied to floating types only)");
}

}  // namespace

void reduce(void* out, const void* a, const void* b, std::size_t count, DType dtype, ReduceOp op,
            NativeStream stream) {
  if (!supports(op, dtype)) throw Error(ErrorCode::unsupported, unsupported_message(op, dtype));
  if (count == 0) return;
  const std::size_t n = elements(count, dtype);
  with_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, Bool>)
      bool_reduce_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(
          static_cast<Bool*>(out), static_cast<const Bool*>(a), static_cast<const Bool*>(b), n, op);
    else
      reduce_kernel<T><<<blocks_for(n), threads_per_block, 0, stream>>>(
          static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), n, op);
  });
  check_launch("reduce", count, dtype);
}

void average(void* data, std::size_t count, DType dtype, int divisor, NativeStream stream) {
  if (!supports(ReduceOp::avg, dtype))
    throw Error(ErrorCode::unsupported, unsupported_message(ReduceOp::avg, dtype));
  if (count == 0) return;
  const std::size_t n = elements(count, dtype);
  with_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, Bool>)
      divide_kernel<T>
          <<<blocks_for(n), threads_per_block, 0, stream>>>(static_cast<T*>(data), n, divisor);
  });
  check_launch("average", count, dtype);
}

void scale(const void* in, void* out, std::size_t count, DType dtype, double factor,
           NativeStream stream) {
  require_scalable("scale", dtype);
  if (count == 0) return;
  if (in == nullptr || out == nullptr)
    throw Error(ErrorCode::invalid_argument,
                "scale of " + std::to_string(count) + " elements: null buffer");
  const std::size_t n = elements(count, dtype);
  with_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, Half> ||
                  std::is_same_v<T, BHalf>)
      scale_kernel<T><<<blocks_for(n), threads_per_block, 0, stream>>>(
          static_cast<const T*>(in), static_cast<T*>(out), n, factor);
  });
  check_launch("scale", count, dtype);
}

void scale(void* data, std::size_t count, DType dtype, double factor, NativeStream stream) {
  scale(data, data, count, dtype, factor, stream);
}

void cast(const void* in, DType from, void* out, DType to, std::size_t count, NativeStream stream) {
  cast(in, from, out, to, count, 1.0, stream);
}

void cast(const void* in, DType from, void* out, DType to, std::size_t count, double factor,
          NativeStream stream) {
  if (!can_cast(from, to))
    throw Error(ErrorCode::unsupported, "cast from " + std::string(to_string(from)) + " to " +
                                            std::string(to_string(to)) +
                                            " is not supported (float32, float16 and bfloat16 "
                                            "convert among themselves)");
  if (count == 0) return;
  if (in == nullptr || out == nullptr)
    throw Error(ErrorCode::invalid_argument,
                "cast of " + std::to_string(count) + " elements: null buffer");
  if (from == to) {
    if (factor != 1.0)
      scale(in, out, count, from, factor, stream);
    else if (in != out)
      check(cudaMemcpyAsync(out, in, count * dtype_size(from), cudaMemcpyDefault, stream),
            "cast (cudaMemcpyAsync)");
    return;
  }
  auto launch = [&](auto from_tag, auto to_tag) {
    using F = decltype(from_tag);
    using T = decltype(to_tag);
    cast_kernel<F, T><<<blocks_for(count), threads_per_block, 0, stream>>>(
        static_cast<const F*>(in), static_cast<T*>(out), count, static_cast<float>(factor));
  };
  if (from == DType::float32 && to == DType::float16) launch(float{}, Half{});
  if (from == DType::float32 && to == DType::bfloat16) launch(float{}, BHalf{});
  if (from == DType::float16 && to == DType::float32) launch(Half{}, float{});
  if (from == DType::bfloat16 && to == DType::float32) launch(BHalf{}, float{});
  if (from == DType::float16 && to == DType::bfloat16) launch(Half{}, BHalf{});
  if (from == DType::bfloat16 && to == DType::float16) launch(BHalf{}, Half{});
  check_launch("cast", count, from);
}

}  // namespace loom::kernels::cuda
