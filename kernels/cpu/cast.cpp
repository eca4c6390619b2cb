// CPU dtype conversion between float32, float16 and bfloat16 (through float, rounding once).
#include "loom/kernels/cast.hpp"

#include <cstring>
#include <string>

#include "loom/error.hpp"

namespace loom::kernels {
namespace {

bool castable(DType d) noexcept {
  return d == DType::float32 || d == DType::float16 || d == DType::bfloat16;
}

float load(const void* in, DType from, std::size_t i) {
  switch (from) {
    case DType::float16:
      return to_float(static_cast<const float16_t*>(in)[i]);
    case DType::bfloat16:
      return to_float(static_cast<const bfloat16_t*>(in)[i]);
    default:
      return static_cast<const float*>(in)[i];
  }
}

void store(void* out, DType to, std::size_t i, float value) {
  switch (to) {
    case DType::float16:
      static_cast<float16_t*>(out)[i] = to_float16(value);
      return;
    case DType::bfloat16:
      static_cast<bfloat16_t*>(out)[i] = to_bfloat16(value);
      return;
    default:
      static_cast<float*>(out)[i] = value;
  }
}

}  // namespace

bool can_cast(DType from, DType to) noexcept {
  return castable(from) && castable(to);
}

void cast(const void* in, DType from, void* out, DType to, std::size_t count) {
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
    if (in != out) std::memmove(out, in, count * dtype_size(from));
    return;
  }
  // Element i is read before it is written, so in == out works when sizes are equal.
  for (std::size_t i = 0; i < count; ++i) store(out, to, i, load(in, from, i));
}

}  // namespace loom::kernels
