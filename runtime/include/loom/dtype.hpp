// Element types, reduction operators and the 16-bit float storage types loom moves.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace loom {

/// @brief Element type of a buffer.
enum class DType : std::uint8_t { float32, float64, float16, bfloat16, int32, int64, uint8 };

/// @brief Every DType, in declaration order (handy for tests and tools).
inline constexpr DType all_dtypes[] = {DType::float32,  DType::float64, DType::float16,
                                       DType::bfloat16, DType::int32,   DType::int64,
                                       DType::uint8};

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
      return 8;
    case DType::float16:
    case DType::bfloat16:
      return 2;
    case DType::uint8:
      return 1;
  }
  return 0;
}
/// @brief "float32", "bfloat16", ...
std::string_view to_string(DType dtype) noexcept;
/// @brief "sum", "avg", ...
std::string_view to_string(ReduceOp op) noexcept;
/// @brief Parses a dtype name (also accepts nccl-tests' short names: float, half, bf16, int,
/// int64, uint8, double); throws loom::Error naming the token otherwise.
DType parse_dtype(std::string_view name);
/// @brief Parses "sum|prod|min|max|avg"; throws loom::Error naming the token otherwise.
ReduceOp parse_reduce_op(std::string_view name);

constexpr bool is_floating(DType dtype) noexcept {
  return dtype == DType::float32 || dtype == DType::float64 || dtype == DType::float16 ||
         dtype == DType::bfloat16;
}

/// @brief Whether `op` is defined on `dtype`: avg on integers is not (it would truncate).
/// Inline: every collective's validation asks.
constexpr bool supports(ReduceOp op, DType dtype) noexcept {
  return op != ReduceOp::avg || is_floating(dtype);
}

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

}  // namespace loom
