// CPU dtype conversion between float32, float16 and bfloat16 (through float, rounding once),
// optionally scaling in the same pass; vectorised where simd.hpp can, element by element after.
#include "loom/kernels/cast.hpp"

#include <cstring>
#include <string>
#include <type_traits>

#include "loom/error.hpp"
#include "simd.hpp"

namespace loom::kernels {
namespace {

bool castable(DType d) noexcept {
  return d == DType::float32 || d == DType::float16 || d == DType::bfloat16;
}

float widen(float x) noexcept {
  return x;
}
float widen(float16_t x) noexcept {
  return to_float(x);
}
float widen(bfloat16_t x) noexcept {
  return to_float(x);
}

template <class T>
T narrow(float x) noexcept {
  if constexpr (std::is_same_v<T, float16_t>)
    return to_float16(x);
  else if constexpr (std::is_same_v<T, bfloat16_t>)
    return to_bfloat16(x);
  else
    return x;
}

// One typed loop per pair, so the element loop has no dtype switch; it starts where the
// vectorised loop stopped. Element i is read before it is written, so in == out works when
// sizes are equal.
template <class From, class To, bool scaled>
void convert(const void* in, void* out, std::size_t start, std::size_t count, float factor) {
  const auto* x = static_cast<const From*>(in);
  auto* y = static_cast<To*>(out);
  for (std::size_t i = start; i < count; ++i) {
    if constexpr (scaled)
      y[i] = narrow<To>(widen(x[i]) * factor);
    else
      y[i] = narrow<To>(widen(x[i]));
  }
}

template <class From, bool scaled>
void convert_to(const void* in, void* out, DType to, std::size_t start, std::size_t count,
                float factor) {
  switch (to) {
    case DType::float16:
      return convert<From, float16_t, scaled>(in, out, start, count, factor);
    case DType::bfloat16:
      return convert<From, bfloat16_t, scaled>(in, out, start, count, factor);
    default:
      return convert<From, float, scaled>(in, out, start, count, factor);
  }
}

template <bool scaled>
void convert(const void* in, DType from, void* out, DType to, std::size_t count, float factor) {
  const std::size_t start = simd::cast(in, from, out, to, count, scaled, factor);
  switch (from) {
    case DType::float16:
      return convert_to<float16_t, scaled>(in, out, to, start, count, factor);
    case DType::bfloat16:
      return convert_to<bfloat16_t, scaled>(in, out, to, start, count, factor);
    default:
      return convert_to<float, scaled>(in, out, to, start, count, factor);
  }
}

// Whether a cast of `count` elements has anything to do; throws for what it cannot do.
bool check(const void* in, DType from, void* out, DType to, std::size_t count) {
  if (!can_cast(from, to))
    throw Error(ErrorCode::unsupported, "cast from " + std::string(to_string(from)) + " to " +
                                            std::string(to_string(to)) +
                                            " is not supported (float32, float16 and bfloat16 "
                                            "convert among themselves)");
  if (count == 0) return false;
  if (in == nullptr || out == nullptr)
    throw Error(ErrorCode::invalid_argument,
                "cast of " + std::to_string(count) + " elements from " +
                    std::string(to_string(from)) + " to " + std::string(to_string(to)) + ": the " +
                    (in == nullptr && out == nullptr ? "input and output buffers are"
                     : in == nullptr                 ? "input buffer is"
                                                     : "output buffer is") +
                    " null");
  return true;
}

}  // namespace

bool can_cast(DType from, DType to) noexcept {
  return castable(from) && castable(to);
}

void cast(const void* in, DType from, void* out, DType to, std::size_t count) {
  if (!check(in, from, out, to, count)) return;
  if (from == to) {
    if (in != out) std::memmove(out, in, count * dtype_size(from));
    return;
  }
  convert<false>(in, from, out, to, count, 1.0f);
}

void cast(const void* in, DType from, void* out, DType to, std::size_t count, double factor) {
  if (!check(in, from, out, to, count)) return;
  convert<true>(in, from, out, to, count, static_cast<float>(factor));
}

}  // namespace loom::kernels
