// The AVX2 + F16C loops for float16/bfloat16 and the choice of Isa, made once from the CPU.
#include "simd.hpp"

#include <atomic>
#include <string>
#include <type_traits>

#include "loom/error.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#define LOOM_SIMD_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace loom::kernels::simd {
namespace {

#if LOOM_SIMD_X86

// Each function below is compiled for AVX2 + F16C whatever the build's -march, and only called
// once the CPU is known to have them, so the library still runs on any x86-64.
#define LOOM_AVX2 __attribute__((target("avx2,f16c")))

namespace avx2 {

constexpr std::size_t width = 8;

struct Float32 {
  using Element = float;
  LOOM_AVX2 static __m256 load(const float* p) { return _mm256_loadu_ps(p); }
  LOOM_AVX2 static void store(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
};

struct Float16 {
  using Element = float16_t;

  // vcvtph2ps quiets a signalling NaN; half_bits.hpp keeps its bits (payload << 13), so NaN
  // lanes take the bits made the scalar way.
  LOOM_AVX2 static __m256 load(const float16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m256 widened = _mm256_cvtph_ps(h);
    const __m256i bits = _mm256_cvtepu16_epi32(h);
    const __m256i magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fff));
    const __m256i nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7c00));
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x8000)), 16);
    const __m256i nan_bits = _mm256_or_si256(_mm256_or_si256(sign, _mm256_set1_epi32(0x70000000)),
                                             _mm256_slli_epi32(magnitude, 13));
    return _mm256_blendv_ps(widened, _mm256_castsi256_ps(nan_bits), _mm256_castsi256_ps(nan));
  }

  // vcvtps2ph keeps the top of a NaN's payload; half_bits.hpp gives sign | 0x7e00, which is
  // what vcvtps2ph makes of sign | 0x7fc00000, so NaN lanes are replaced by that first.
  LOOM_AVX2 static void store(float16_t* p, __m256 v) {
    const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    const __m256 quiet = _mm256_or_ps(_mm256_and_ps(v, _mm256_set1_ps(-0.0f)),
                                      _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)));
    const __m128i h = _mm256_cvtps_ph(_mm256_blendv_ps(v, quiet, nan),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h);
  }
};

struct Bfloat16 {
  using Element = bfloat16_t;

  LOOM_AVX2 static __m256 load(const bfloat16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }

  // half_bits.hpp's rounding on the integer bits: add 0x7fff plus the lowest kept bit, keep the
  // top half; NaN keeps its top half with the quiet bit set. (avx512_bf16's vcvtneps2bf16 is
  // not used: it flushes subnormal floats to zero, which this rounding does not.)
  LOOM_AVX2 static void store(bfloat16_t* p, __m256 v) {
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i top = _mm256_srli_epi32(bits, 16);
    const __m256i rounding =
        _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(top, _mm256_set1_epi32(1)));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, rounding), 16);
    const __m256i magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
    const __m256i nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f800000));
    const __m256i quiet = _mm256_or_si256(top, _mm256_set1_epi32(0x40));
    const __m256i result = _mm256_blendv_epi8(rounded, quiet, nan);
    // Every lane is below 0x10000, so the saturating pack is exact; it packs within 128-bit
    // halves, and the permute brings lanes 0-3 and 4-7 together.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(result, result), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
};

// The float operations of reduce.cpp's scalar loops, in their operand order. Min and max pick
// with explicit NaN rules, so their bits always agree with the scalar path. For + and * with
// two NaN operands, IEEE 754 leaves open whose sign and payload the result carries (x86 takes
// the first operand's) and g++ treats both as commutative on either path, so such an element
// is a NaN on both paths but its sign (and bfloat16 payload) may differ; every other element
// has the same bits.
struct Sum {
  LOOM_AVX2 static __m256 apply(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
};
struct Prod {
  LOOM_AVX2 static __m256 apply(__m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
};
// Scalar: b is NaN ? b : (b < a ? b : a). minps(b, a) is b < a ? b : a.
struct Min {
  LOOM_AVX2 static __m256 apply(__m256 a, __m256 b) {
    return _mm256_blendv_ps(_mm256_min_ps(b, a), b, _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
  }
};
// Scalar: b is NaN ? b : (a < b ? b : a). maxps(b, a) is b > a ? b : a.
struct Max {
  LOOM_AVX2 static __m256 apply(__m256 a, __m256 b) {
    return _mm256_blendv_ps(_mm256_max_ps(b, a), b, _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
  }
};

template <class From, class To, bool scaled>
LOOM_AVX2 std::size_t convert(const void* in, void* out, std::size_t count, float factor) {
  const auto* x = static_cast<const typename From::Element*>(in);
  auto* y = static_cast<typename To::Element*>(out);
  const __m256 f = _mm256_set1_ps(factor);
  std::size_t i = 0;
  for (; i + width <= count; i += width) {
    __m256 v = From::load(x + i);
    if constexpr (scaled) v = _mm256_mul_ps(v, f);
    To::store(y + i, v);
  }
  return i;
}

template <class From, bool scaled>
std::size_t convert_to(const void* in, void* out, DType to, std::size_t count, float factor) {
  switch (to) {
    case DType::float16:
      return convert<From, Float16, scaled>(in, out, count, factor);
    case DType::bfloat16:
      return convert<From, Bfloat16, scaled>(in, out, count, factor);
    case DType::float32:
      if constexpr (!std::is_same_v<From, Float32>)
        return convert<From, Float32, scaled>(in, out, count, factor);
      return 0;
    default:
      return 0;
  }
}

template <bool scaled>
std::size_t convert(const void* in, DType from, void* out, DType to, std::size_t count,
                    float factor) {
  switch (from) {
    case DType::float32:
      return convert_to<Float32, scaled>(in, out, to, count, factor);
    case DType::float16:
      return convert_to<Float16, scaled>(in, out, to, count, factor);
    case DType::bfloat16:
      return convert_to<Bfloat16, scaled>(in, out, to, count, factor);
    default:
      return 0;
  }
}

template <class Format, class Op>
LOOM_AVX2 std::size_t combine(void* out, const void* a, const void* b, std::size_t count) {
  auto* o = static_cast<typename Format::Element*>(out);
  const auto* x = static_cast<const typename Format::Element*>(a);
  const auto* y = static_cast<const typename Format::Element*>(b);
  std::size_t i = 0;
  for (; i + width <= count; i += width)
    Format::store(o + i, Op::apply(Format::load(x + i), Format::load(y + i)));
  return i;
}

template <class Format>
std::size_t combine(void* out, const void* a, const void* b, std::size_t count, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return combine<Format, Sum>(out, a, b, count);
    case ReduceOp::prod:
      return combine<Format, Prod>(out, a, b, count);
    case ReduceOp::min:
      return combine<Format, Min>(out, a, b, count);
    case ReduceOp::max:
      return combine<Format, Max>(out, a, b, count);
  }
  return 0;
}

template <class Format>
LOOM_AVX2 std::size_t divide(void* data, std::size_t count, float divisor) {
  auto* p = static_cast<typename Format::Element*>(data);
  const __m256 d = _mm256_set1_ps(divisor);
  std::size_t i = 0;
  for (; i + width <= count; i += width)
    Format::store(p + i, _mm256_div_ps(Format::load(p + i), d));
  return i;
}

}  // namespace avx2

#undef LOOM_AVX2

#endif  // LOOM_SIMD_X86

Isa detect() noexcept {
#if LOOM_SIMD_X86
  // __builtin_cpu_supports("avx2") also checks that the OS saves the YMM registers, which F16C
  // needs too; F16C itself comes from CPUID (clang's builtin does not know the name "f16c").
  __builtin_cpu_init();
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
  if (__builtin_cpu_supports("avx2") && f16c) return Isa::avx2_f16c;
#endif
  return Isa::scalar;
}

std::atomic<Isa>& chosen() noexcept {
  static std::atomic<Isa> isa{best()};
  return isa;
}

bool vectorised() noexcept {
  return chosen().load(std::memory_order_relaxed) != Isa::scalar;
}

}  // namespace

std::string_view to_string(Isa isa) noexcept {
  switch (isa) {
    case Isa::scalar:
      return "scalar";
    case Isa::avx2_f16c:
      return "avx2_f16c";
  }
  return "unknown";
}

bool supported(Isa isa) noexcept {
  return isa == Isa::scalar || isa == best();
}

Isa best() noexcept {
  static const Isa isa = detect();
  return isa;
}

Isa current() noexcept {
  return chosen().load(std::memory_order_relaxed);
}

Isa use(Isa isa) {
  if (!supported(isa))
    throw Error(ErrorCode::unsupported,
                "kernels: this CPU cannot run the " + std::string(to_string(isa)) +
                    " loops (best: " + std::string(to_string(best())) + ")");
  return chosen().exchange(isa, std::memory_order_relaxed);
}

std::size_t cast(const void* in, DType from, void* out, DType to, std::size_t count, bool scaled,
                 float factor) noexcept {
#if LOOM_SIMD_X86
  if (vectorised())
    return scaled ? avx2::convert<true>(in, from, out, to, count, factor)
                  : avx2::convert<false>(in, from, out, to, count, factor);
#endif
  (void)in, (void)from, (void)out, (void)to, (void)count, (void)scaled, (void)factor;
  return 0;
}

std::size_t reduce(void* out, const void* a, const void* b, std::size_t count, DType dtype,
                   ReduceOp op) noexcept {
#if LOOM_SIMD_X86
  if (vectorised()) {
    if (dtype == DType::float16) return avx2::combine<avx2::Float16>(out, a, b, count, op);
    if (dtype == DType::bfloat16) return avx2::combine<avx2::Bfloat16>(out, a, b, count, op);
  }
#endif
  (void)out, (void)a, (void)b, (void)count, (void)dtype, (void)op;
  return 0;
}

std::size_t divide(void* data, std::size_t count, DType dtype, float divisor) noexcept {
#if LOOM_SIMD_X86
  if (vectorised()) {
    if (dtype == DType::float16) return avx2::divide<avx2::Float16>(data, count, divisor);
    if (dtype == DType::bfloat16) return avx2::divide<avx2::Bfloat16>(data, count, divisor);
  }
#endif
  (void)data, (void)count, (void)dtype, (void)divisor;
  return 0;
}

}  // namespace loom::kernels::simd
