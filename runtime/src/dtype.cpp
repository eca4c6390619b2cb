// Names, sizes and 16-bit float conversions for loom's element types.
#include "loom/dtype.hpp"

#include <bit>
#include <string>

#include "loom/error.hpp"

namespace loom {

std::size_t dtype_size(DType dtype) noexcept {
  switch (dtype) {
    case DType::float32:
      return 4;
    case DType::float64:
      return 8;
    case DType::float16:
      return 2;
    case DType::bfloat16:
      return 2;
    case DType::int32:
      return 4;
    case DType::int64:
      return 8;
    case DType::uint8:
      return 1;
  }
  return 0;
}

std::string_view to_string(DType dtype) noexcept {
  switch (dtype) {
    case DType::float32:
      return "float32";
    case DType::float64:
      return "float64";
    case DType::float16:
      return "float16";
    case DType::bfloat16:
      return "bfloat16";
    case DType::int32:
      return "int32";
    case DType::int64:
      return "int64";
    case DType::uint8:
      return "uint8";
  }
  return "unknown";
}

std::string_view to_string(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::prod:
      return "prod";
    case ReduceOp::min:
      return "min";
    case ReduceOp::max:
      return "max";
    case ReduceOp::avg:
      return "avg";
  }
  return "unknown";
}

DType parse_dtype(std::string_view name) {
  for (DType d : all_dtypes)
    if (name == to_string(d)) return d;
  if (name == "float" || name == "f32") return DType::float32;
  if (name == "double" || name == "f64") return DType::float64;
  if (name == "half" || name == "f16") return DType::float16;
  if (name == "bf16") return DType::bfloat16;
  if (name == "int") return DType::int32;
  throw Error(ErrorCode::invalid_argument,
              "unknown dtype '" + std::string(name) +
                  "' (expected float32, float64, float16, bfloat16, int32, int64 or uint8)");
}

ReduceOp parse_reduce_op(std::string_view name) {
  for (ReduceOp op : all_reduce_ops)
    if (name == to_string(op)) return op;
  throw Error(ErrorCode::invalid_argument, "unknown reduce op '" + std::string(name) +
                                               "' (expected sum, prod, min, max or avg)");
}

bool is_floating(DType dtype) noexcept {
  return dtype == DType::float32 || dtype == DType::float64 || dtype == DType::float16 ||
         dtype == DType::bfloat16;
}

bool supports(ReduceOp op, DType dtype) noexcept {
  return op != ReduceOp::avg || is_floating(dtype);
}

float to_float(float16_t value) noexcept {
  const std::uint32_t h = value.bits;
  const std::uint32_t sign = (h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  std::uint32_t mantissa = h & 0x3ffu;
  std::uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      do {
        ++e;
        mantissa <<= 1;
      } while ((mantissa & 0x400u) == 0);
      bits = sign | (static_cast<std::uint32_t>(127 - 15 - e) << 23) | ((mantissa & 0x3ffu) << 13);
    }
  } else if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + (127 - 15)) << 23) | (mantissa << 13);
  }
  return std::bit_cast<float>(bits);
}

float16_t to_float16(float value) noexcept {
  const std::uint32_t f = std::bit_cast<std::uint32_t>(value);
  const std::uint16_t sign = static_cast<std::uint16_t>((f >> 16) & 0x8000u);
  const std::uint32_t abs = f & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN (keep NaN quiet and non-zero)
    const std::uint16_t mant = abs > 0x7f800000u ? 0x200u : 0;
    return {static_cast<std::uint16_t>(sign | 0x7c00u | mant)};
  }
  if (abs >= 0x477ff000u) return {static_cast<std::uint16_t>(sign | 0x7c00u)};  // rounds to inf
  if (abs < 0x38800000u) {                 // result is subnormal or zero
    if (abs < 0x33000000u) return {sign};  // below half the smallest subnormal
    const std::uint32_t exponent = abs >> 23;
    const std::uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126 - exponent;  // 14..24
    std::uint32_t half = mantissa >> shift;
    const std::uint32_t rest = mantissa & ((1u << shift) - 1);
    const std::uint32_t midpoint = 1u << (shift - 1);
    if (rest > midpoint || (rest == midpoint && (half & 1u))) ++half;
    return {static_cast<std::uint16_t>(sign | half)};
  }
  // normal: rebias and round to nearest even on the 13 dropped bits
  std::uint32_t half = ((abs >> 13) - ((127 - 15) << 10));
  const std::uint32_t rest = abs & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // may carry into inf: correct
  return {static_cast<std::uint16_t>(sign | half)};
}

float to_float(bfloat16_t value) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(value.bits) << 16);
}

bfloat16_t to_bfloat16(float value) noexcept {
  const std::uint32_t f = std::bit_cast<std::uint32_t>(value);
  if ((f & 0x7fffffffu) > 0x7f800000u)
    return {static_cast<std::uint16_t>((f >> 16) | 0x40u)};  // quiet NaN
  const std::uint32_t rounding = 0x7fffu + ((f >> 16) & 1u);
  return {static_cast<std::uint16_t>((f + rounding) >> 16)};
}

}  // namespace loom
