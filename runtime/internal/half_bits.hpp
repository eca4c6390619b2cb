// The float16/bfloat16 <-> float bit conversions, written once for host (dtype.cpp) and device
// (kernels/cuda) so that both round identically: round to nearest even, NaN kept quiet.
#pragma once

#include <bit>
#include <cstdint>

#ifdef __CUDACC__
#define LOOM_HOST_DEVICE __host__ __device__
#else
#define LOOM_HOST_DEVICE
#endif

namespace loom::half_bits {

LOOM_HOST_DEVICE inline std::uint32_t float_to_bits(float value) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(value);
#else
  return std::bit_cast<std::uint32_t>(value);
#endif
}

LOOM_HOST_DEVICE inline float bits_to_float(std::uint32_t bits) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(bits);
#else
  return std::bit_cast<float>(bits);
#endif
}

LOOM_HOST_DEVICE inline float float16_to_float(std::uint16_t h16) {
  const std::uint32_t h = h16;
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
  return bits_to_float(bits);
}

LOOM_HOST_DEVICE inline std::uint16_t float_to_float16(float value) {
  const std::uint32_t f = float_to_bits(value);
  const std::uint16_t sign = static_cast<std::uint16_t>((f >> 16) & 0x8000u);
  const std::uint32_t abs = f & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN (keep NaN quiet and non-zero)
    const std::uint16_t mant = abs > 0x7f800000u ? 0x200u : 0;
    return static_cast<std::uint16_t>(sign | 0x7c00u | mant);
  }
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {               // result is subnormal or zero
    if (abs < 0x33000000u) return sign;  // below half the smallest subnormal
    const std::uint32_t exponent = abs >> 23;
    const std::uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126 - exponent;  // 14..24
    std::uint32_t half = mantissa >> shift;
    const std::uint32_t rest = mantissa & ((1u << shift) - 1);
    const std::uint32_t midpoint = 1u << (shift - 1);
    if (rest > midpoint || (rest == midpoint && (half & 1u))) ++half;
    return static_cast<std::uint16_t>(sign | half);
  }
  // normal: rebias and round to nearest even on the 13 dropped bits
  std::uint32_t half = ((abs >> 13) - ((127 - 15) << 10));
  const std::uint32_t rest = abs & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // may carry into inf: correct
  return static_cast<std::uint16_t>(sign | half);
}

LOOM_HOST_DEVICE inline float bfloat16_to_float(std::uint16_t b) {
  return bits_to_float(static_cast<std::uint32_t>(b) << 16);
}

LOOM_HOST_DEVICE inline std::uint16_t float_to_bfloat16(float value) {
  const std::uint32_t f = float_to_bits(value);
  if ((f & 0x7fffffffu) > 0x7f800000u)
    return static_cast<std::uint16_t>((f >> 16) | 0x40u);  // quiet NaN
  const std::uint32_t rounding = 0x7fffu + ((f >> 16) & 1u);
  return static_cast<std::uint16_t>((f + rounding) >> 16);
}

}  // namespace loom::half_bits
