// CPU reductions written as plain loops so g++ -O3 vectorises them
// (checked with -fopt-info-vec: the float32/float64/int loops become AVX/SSE code); the
// float16/bfloat16 loops go through simd.hpp first, which does what the CPU allows.
#include "loom/kernels/reduce.hpp"

#include <cmath>
#include <cstdint>
#include <string>

#include "loom/error.hpp"
#include "simd.hpp"

namespace loom::kernels {
namespace {

template <class T>
struct Sum {
  static T apply(T a, T b) { return a + b; }
};
template <class T>
struct Prod {
  static T apply(T a, T b) { return a * b; }
};
template <class T>
struct Min {
  static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      if (b != b) return b;  // NaN wins, as in PyTorch and NCCL
    }
    return b < a ? b : a;
  }
};
template <class T>
struct Max {
  static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      if (b != b) return b;
    }
    return a < b ? b : a;
  }
};

// torch.bool: one byte, 0 or 1. sum and max are logical or, prod and min logical and (as Gloo
// computes them on bool and as NCCL does through max and min on uint8). Any non-zero byte
// reads as true; the result is always 0 or 1.
struct LogicalOr {
  static std::uint8_t apply(std::uint8_t a, std::uint8_t b) { return (a | b) != 0; }
};
struct LogicalAnd {
  static std::uint8_t apply(std::uint8_t a, std::uint8_t b) { return (a != 0) & (b != 0); }
};

template <class Op>
void combine_bool(void* out, const void* a, const void* b, std::size_t n) {
  auto* o = static_cast<std::uint8_t*>(out);
  auto* x = static_cast<const std::uint8_t*>(a);
  auto* y = static_cast<const std::uint8_t*>(b);
  for (std::size_t i = 0; i < n; ++i) o[i] = Op::apply(x[i], y[i]);
}

void dispatch_bool(void* out, const void* a, const void* b, std::size_t n, ReduceOp op) {
  if (op == ReduceOp::sum || op == ReduceOp::max) return combine_bool<LogicalOr>(out, a, b, n);
  return combine_bool<LogicalAnd>(out, a, b, n);  // prod, min (avg is refused before)
}

// Integers are combined as unsigned so overflow wraps instead of being undefined; types
// narrower than unsigned int in unsigned int itself (uint16_t operands would be promoted to a
// signed int, whose product can overflow: 41377 * 64417).
template <class T>
using Arith = std::conditional_t<
    std::is_integral_v<T>,
    std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>, T>;

// No restrict: out == a is the common in-place case. g++ versions the loop with a runtime
// overlap check, so both the aliasing and the disjoint case run vectorised.
template <class T, template <class> class Op>
void combine(T* out, const T* a, const T* b, std::size_t n) {
  if constexpr (std::is_integral_v<T> &&
                (std::is_same_v<Op<T>, Sum<T>> || std::is_same_v<Op<T>, Prod<T>>)) {
    using U = Arith<T>;
    for (std::size_t i = 0; i < n; ++i)
      out[i] = static_cast<T>(Op<U>::apply(static_cast<U>(a[i]), static_cast<U>(b[i])));
  } else {
    for (std::size_t i = 0; i < n; ++i) out[i] = Op<T>::apply(a[i], b[i]);
  }
}

// 16-bit floats: convert a block to float, combine, round back. Blocks keep the float
// temporaries in L1 and let the float loop vectorise.
template <class T, template <class> class Op>
void combine_half(T* out, const T* a, const T* b, std::size_t n) {
  constexpr std::size_t block = 256;
  float fa[block], fb[block];
  for (std::size_t start = 0; start < n; start += block) {
    const std::size_t m = std::min(block, n - start);
    for (std::size_t i = 0; i < m; ++i) fa[i] = to_float(a[start + i]);
    for (std::size_t i = 0; i < m; ++i) fb[i] = to_float(b[start + i]);
    combine<float, Op>(fa, fa, fb, m);
    if constexpr (std::is_same_v<T, float16_t>) {
      for (std::size_t i = 0; i < m; ++i) out[start + i] = to_float16(fa[i]);
    } else {
      for (std::size_t i = 0; i < m; ++i) out[start + i] = to_bfloat16(fa[i]);
    }
  }
}

template <class T>
void dispatch_op(void* out, const void* a, const void* b, std::size_t n, ReduceOp op) {
  auto* o = static_cast<T*>(out);
  auto* x = static_cast<const T*>(a);
  auto* y = static_cast<const T*>(b);
  constexpr bool half = std::is_same_v<T, float16_t> || std::is_same_v<T, bfloat16_t>;
  if constexpr (half) {  // the scalar loops below do what the vectorised one left
    const std::size_t done = simd::reduce(o, x, y, n, dtype_of<T>(), op);
    o += done;
    x += done;
    y += done;
    n -= done;
  }
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      if constexpr (half)
        return combine_half<T, Sum>(o, x, y, n);
      else
        return combine<T, Sum>(o, x, y, n);
    case ReduceOp::prod:
      if constexpr (half)
        return combine_half<T, Prod>(o, x, y, n);
      else
        return combine<T, Prod>(o, x, y, n);
    case ReduceOp::min:
      if constexpr (half)
        return combine_half<T, Min>(o, x, y, n);
      else
        return combine<T, Min>(o, x, y, n);
    case ReduceOp::max:
      if constexpr (half)
        return combine_half<T, Max>(o, x, y, n);
      else
        return combine<T, Max>(o, x, y, n);
  }
}

[[noreturn]] void not_floating(const char* what, DType dtype) {
  throw Error(ErrorCode::unsupported, std::string(what) + " is not defined for " +
                                          std::string(to_string(dtype)) +
                                          " (a scale factor is applied to floating types only)");
}

// 16-bit floats multiply in float by the factor rounded to float, as average() divides.
template <class T>
void scale_floats(const void* in, void* out, std::size_t n, double factor) {
  const auto* x = static_cast<const T*>(in);
  auto* y = static_cast<T*>(out);
  if constexpr (std::is_same_v<T, float16_t>) {
    const float f = static_cast<float>(factor);
    const std::size_t done = simd::cast(in, DType::float16, out, DType::float16, n, true, f);
    for (std::size_t i = done; i < n; ++i) y[i] = to_float16(to_float(x[i]) * f);
  } else if constexpr (std::is_same_v<T, bfloat16_t>) {
    const float f = static_cast<float>(factor);
    const std::size_t done = simd::cast(in, DType::bfloat16, out, DType::bfloat16, n, true, f);
    for (std::size_t i = done; i < n; ++i) y[i] = to_bfloat16(to_float(x[i]) * f);
  } else {
    const T f = static_cast<T>(factor);
    for (std::size_t i = 0; i < n; ++i) y[i] = x[i] * f;
  }
}

// avg on integers as ncclAvg computes it: the wrapped sum divided with truncation toward zero
// (C++'s integer division). int8 and int16 promote to int, whose division truncates the same.
template <class T>
void divide_integers(void* data, std::size_t n, int divisor) {
  auto* p = static_cast<T*>(data);
  const auto d = static_cast<T>(divisor);
  if constexpr (sizeof(T) < sizeof(int)) {
    for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<T>(p[i] / divisor);
  } else {
    for (std::size_t i = 0; i < n; ++i) p[i] /= d;
  }
}

template <class T>
void divide_floats(void* data, std::size_t n, int divisor) {
  auto* p = static_cast<T*>(data);
  if constexpr (std::is_same_v<T, float16_t>) {
    const float d = static_cast<float>(divisor);
    for (std::size_t i = simd::divide(p, n, DType::float16, d); i < n; ++i)
      p[i] = to_float16(to_float(p[i]) / d);
  } else if constexpr (std::is_same_v<T, bfloat16_t>) {
    const float d = static_cast<float>(divisor);
    for (std::size_t i = simd::divide(p, n, DType::bfloat16, d); i < n; ++i)
      p[i] = to_bfloat16(to_float(p[i]) / d);
  } else {
    const T d = static_cast<T>(divisor);
    for (std::size_t i = 0; i < n; ++i) p[i] /= d;  // division, not * (1/d): exact for avg
  }
}

}  // namespace

void reduce(void* out, const void* a, const void* b, std::size_t count, DType dtype, ReduceOp op) {
  if (!supports(op, dtype)) throw Error(ErrorCode::unsupported, unsupported_message(op, dtype));
  if (count == 0) return;
  switch (dtype) {
    case DType::float32:
      return dispatch_op<float>(out, a, b, count, op);
    case DType::float64:
      return dispatch_op<double>(out, a, b, count, op);
    case DType::float16:
      return dispatch_op<float16_t>(out, a, b, count, op);
    case DType::bfloat16:
      return dispatch_op<bfloat16_t>(out, a, b, count, op);
    case DType::int32:
      return dispatch_op<std::int32_t>(out, a, b, count, op);
    case DType::int64:
      return dispatch_op<std::int64_t>(out, a, b, count, op);
    case DType::uint8:
      return dispatch_op<std::uint8_t>(out, a, b, count, op);
    case DType::int8:
      return dispatch_op<std::int8_t>(out, a, b, count, op);
    case DType::int16:
      return dispatch_op<std::int16_t>(out, a, b, count, op);
    case DType::boolean:
      return dispatch_bool(out, a, b, count, op);
    case DType::complex64:  // sum and avg only: component-wise on the float pairs
      return dispatch_op<float>(out, a, b, 2 * count, op);
    case DType::complex128:
      return dispatch_op<double>(out, a, b, 2 * count, op);
  }
}

void reduce(void* inout, const void* in, std::size_t count, DType dtype, ReduceOp op) {
  reduce(inout, inout, in, count, dtype, op);
}

void average(void* data, std::size_t count, DType dtype, int divisor) {
  switch (dtype) {
    case DType::float32:
      return divide_floats<float>(data, count, divisor);
    case DType::float64:
      return divide_floats<double>(data, count, divisor);
    case DType::float16:
      return divide_floats<float16_t>(data, count, divisor);
    case DType::bfloat16:
      return divide_floats<bfloat16_t>(data, count, divisor);
    case DType::complex64:
      return divide_floats<float>(data, 2 * count, divisor);
    case DType::complex128:
      return divide_floats<double>(data, 2 * count, divisor);
    case DType::int32:
      return divide_integers<std::int32_t>(data, count, divisor);
    case DType::int64:
      return divide_integers<std::int64_t>(data, count, divisor);
    case DType::uint8:
      return divide_integers<std::uint8_t>(data, count, divisor);
    case DType::int8:
      return divide_integers<std::int8_t>(data, count, divisor);
    case DType::int16:
      return divide_integers<std::int16_t>(data, count, divisor);
    case DType::boolean:
      break;
  }
  throw Error(ErrorCode::unsupported, unsupported_message(ReduceOp::avg, DType::boolean));
}

void scale(const void* in, void* out, std::size_t count, DType dtype, double factor) {
  switch (dtype) {
    case DType::float32:
      return scale_floats<float>(in, out, count, factor);
    case DType::float64:
      return scale_floats<double>(in, out, count, factor);
    case DType::float16:
      return scale_floats<float16_t>(in, out, count, factor);
    case DType::bfloat16:
      return scale_floats<bfloat16_t>(in, out, count, factor);
    case DType::complex64:
      return scale_floats<float>(in, out, 2 * count, factor);
    case DType::complex128:
      return scale_floats<double>(in, out, 2 * count, factor);
    default:
      not_floating("scale", dtype);
  }
}

void scale(void* data, std::size_t count, DType dtype, double factor) {
  scale(data, data, count, dtype, factor);
}

}  // namespace loom::kernels
