// Element types, reduction operators and the 16-bit float storage types loom moves.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace loom {

/// @brief Element type of a buffer. boolean is one byte holding 0 or 1 (torch.bool); complex64
/// and complex128 are pairs (real, imaginary) of float32 and float64 (std::complex's layout).
/// New types are appended: the values are stored in flight records and compared across ranks.
enum class DType : std::uint8_t {
  float32,
  float64,
  float16,
  bfloat16,
  int32,
  int64,
  uint8,
  int8,
  int16,
  boolean,
  complex64,
  complex128
};

/// @brief Every DType, in declaration order (handy for tests and tools).
inline constexpr DType all_dtypes[] = {DType::float32,  DType::float64,   DType::float16,
                                       DType::bfloat16, DType::int32,     DType::int64,
                                       DType::uint8,    DType::int8,      DType::int16,
                                       DType::boolean,  DType::complex64, DType::complex128};

/// @brief Reduction applied element-wise by reduce, allreduce and reduce_scatter.
enum class ReduceOp : std::uint8_t { sum, prod, min, max, avg };

inline constexpr ReduceOp all_reduce_ops[] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min,
                                              ReduceOp::max, ReduceOp::avg};

/// @brief Bytes per element. Inline: Buffer::bytes() calls it on every operation's checks.
constexpr std::size_t dtype_size(DType dtype) noexcept {
  switch (dtype) {
    case DType::float32:
    case DType::int32:
      return 4;
    case DType::float64:
    case DType::int64:
    case DType::complex64:
      return 8;
    case DType::float16:
    case DType::bfloat16:
    case DType::int16:
      return 2;
    case DType::uint8:
    case DType::int8:
    case DType::boolean:
      return 1;
    case DType::complex128:
      return 16;
  }
  return 0;
}
/// @brief "float32", "bfloat16", ...
std::string_view to_string(DType dtype) noexcept;
/// @brief "sum", "avg", ...
std::string_view to_string(ReduceOp op) noexcept;
/// @brief Parses a dtype name (every to_string(DType), and nccl-tests' short names: float, half,
/// bf16, int, double); throws loom::Error naming the token otherwise.
DType parse_dtype(std::string_view name);
/// @brief Parses "sum|prod|min|max|avg"; throws loom::Error naming the token otherwise.
ReduceOp parse_reduce_op(std::string_view name);

constexpr bool is_floating(DType dtype) noexcept {
  return dtype == DType::float32 || dtype == DType::float64 || dtype == DType::float16 ||
         dtype == DType::bfloat16;
}

constexpr bool is_complex(DType dtype) noexcept {
  return dtype == DType::complex64 || dtype == DType::complex128;
}

/// @brief The signed and unsigned integer types (boolean is not one: it reduces logically).
constexpr bool is_integer(DType dtype) noexcept {
  return dtype == DType::int32 || dtype == DType::int64 || dtype == DType::uint8 ||
         dtype == DType::int8 || dtype == DType::int16;
}

/// @brief The type of a complex type's halves (float32 for complex64, float64 for
/// complex128); any other type is its own.
constexpr DType real_dtype(DType dtype) noexcept {
  return dtype == DType::complex64    ? DType::float32
         : dtype == DType::complex128 ? DType::float64
                                      : dtype;
}

/// @brief Whether `op` is defined on `dtype`, as NCCL and Gloo define them:
/// - floating and integer types: every op; avg on integers sums (wrapping as the type does) and
///   then divides with truncation toward zero, as ncclAvg does;
/// - boolean: sum and max are logical or, prod and min logical and; avg is not defined (NCCL
///   refuses it on torch.bool);
/// - complex: sum and avg, component-wise; prod, min and max are not (PyTorch refuses them on
///   complex tensors: no order, and a product is not component-wise).
/// Inline: every collective's validation asks.
constexpr bool supports(ReduceOp op, DType dtype) noexcept {
  if (is_complex(dtype)) return op == ReduceOp::sum || op == ReduceOp::avg;
  if (dtype == DType::boolean) return op != ReduceOp::avg;
  return true;
}

/// @brief Why supports(op, dtype) is false, for error messages ("" when it is true).
std::string_view unsupported_reason(ReduceOp op, DType dtype) noexcept;
/// @brief "reduce op avg is not defined for bool (<unsupported_reason>)": the one text every
/// layer (kernels, backends, graph validation) refuses such a pair with.
std::string unsupported_message(ReduceOp op, DType dtype);

/// @brief IEEE 754 binary16 storage; arithmetic goes through float.
struct float16_t {
  std::uint16_t bits = 0;
};
/// @brief bfloat16 storage (the upper half of a binary32); arithmetic goes through float.
struct bfloat16_t {
  std::uint16_t bits = 0;
};

float to_float(float16_t value) noexcept;
float to_float(bfloat16_t value) noexcept;
/// @brief Round to nearest even; overflow gives infinity, NaN stays NaN.
float16_t to_float16(float value) noexcept;
/// @brief Round to nearest even; NaN stays NaN.
bfloat16_t to_bfloat16(float value) noexcept;

/// @brief The DType of a C++ element type: dtype_of<float>() == DType::float32.
template <class T>
constexpr DType dtype_of() noexcept;
template <>
constexpr DType dtype_of<float>() noexcept {
  return DType::float32;
}
template <>
constexpr DType dtype_of<double>() noexcept {
  return DType::float64;
}
template <>
constexpr DType dtype_of<float16_t>() noexcept {
  return DType::float16;
}
template <>
constexpr DType dtype_of<bfloat16_t>() noexcept {
  return DType::bfloat16;
}
template <>
constexpr DType dtype_of<std::int32_t>() noexcept {
  return DType::int32;
}
template <>
constexpr DType dtype_of<std::int64_t>() noexcept {
  return DType::int64;
}
template <>
constexpr DType dtype_of<std::uint8_t>() noexcept {
  return DType::uint8;
}
template <>
constexpr DType dtype_of<std::int8_t>() noexcept {
  return DType::int8;
}
template <>
constexpr DType dtype_of<std::int16_t>() noexcept {
  return DType::int16;
}
template <>
constexpr DType dtype_of<bool>() noexcept {
  static_assert(sizeof(bool) == 1);
  return DType::boolean;
}

}  // namespace loom
