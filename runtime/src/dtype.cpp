// Names, sizes and 16-bit float conversions for loom's element types.
#include "loom/dtype.hpp"

#include <string>

#include "half_bits.hpp"
#include "loom/error.hpp"

namespace loom {

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
    case DType::int8:
      return "int8";
    case DType::int16:
      return "int16";
    case DType::boolean:
      return "bool";
    case DType::complex64:
      return "complex64";
    case DType::complex128:
      return "complex128";
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
  std::string expected;
  for (DType d : all_dtypes) expected += (expected.empty() ? "" : ", ") + std::string(to_string(d));
  throw Error(ErrorCode::invalid_argument,
              "unknown dtype '" + std::string(name) + "' (expected one of " + expected + ")");
}

std::string_view unsupported_reason(ReduceOp op, DType dtype) noexcept {
  if (supports(op, dtype)) return {};
  if (is_complex(dtype))
    return "complex numbers are summed and averaged component-wise; they have no order, and "
           "their product is not component-wise";
  if (dtype == DType::boolean)
    return "bool reduces with sum or max (logical or) and prod or min (logical and)";
  return "not defined";
}

std::string unsupported_message(ReduceOp op, DType dtype) {
  return "reduce op " + std::string(to_string(op)) + " is not defined for " +
         std::string(to_string(dtype)) + " (" + std::string(unsupported_reason(op, dtype)) + ")";
}

ReduceOp parse_reduce_op(std::string_view name) {
  for (ReduceOp op : all_reduce_ops)
    if (name == to_string(op)) return op;
  throw Error(ErrorCode::invalid_argument, "unknown reduce op '" + std::string(name) +
                                               "' (expected sum, prod, min, max or avg)");
}

float to_float(float16_t value) noexcept {
  return half_bits::float16_to_float(value.bits);
}

float16_t to_float16(float value) noexcept {
  return {half_bits::float_to_float16(value)};
}

float to_float(bfloat16_t value) noexcept {
  return half_bits::bfloat16_to_float(value.bits);
}

bfloat16_t to_bfloat16(float value) noexcept {
  return {half_bits::float_to_bfloat16(value)};
}

}  // namespace loom
