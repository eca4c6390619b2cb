// CPU float16/bfloat16 kernel micro-benchmarks at the size of a 1.6 M-gradient model: each
// kernel on the scalar loops and on the best vectorised loops this CPU has, in the same binary.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <loom/kernels/cast.hpp>
#include <loom/kernels/reduce.hpp>
#include <random>
#include <vector>

#include "simd.hpp"

namespace {

namespace simd = loom::kernels::simd;
using loom::DType;

constexpr std::size_t elements = 1600000;

std::vector<float> gradients() {
  std::mt19937 random(7);
  std::normal_distribution<float> normal(0.0f, 1e-2f);
  std::vector<float> values(elements);
  for (float& v : values) v = normal(random);
  return values;
}

// range(0) selects the loops: 0 scalar, 1 the best this CPU has.
simd::Isa isa_of(const benchmark::State& state) {
  return state.range(0) == 0 ? simd::Isa::scalar : simd::best();
}

void report(benchmark::State& state, std::size_t bytes_per_element) {
  state.SetLabel(std::string(simd::to_string(isa_of(state))));
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * elements));
  state.SetBytesProcessed(
      static_cast<std::int64_t>(state.iterations() * elements * bytes_per_element));
}

// The compression hook's cast: float32 gradients to a 16-bit type, with the average folded in
// (`factor`) or not (0: the unscaled cast). Each element is 4 bytes read and 2 written.
void BM_CastFromFloat32(benchmark::State& state, DType to, double factor) {
  simd::ScopedIsa isa(isa_of(state));
  const std::vector<float> in = gradients();
  std::vector<std::uint16_t> out(elements);  // float16_t and bfloat16_t are both 16 bits
  for (auto _ : state) {
    if (factor != 0)
      loom::kernels::cast(in.data(), DType::float32, out.data(), to, elements, factor);
    else
      loom::kernels::cast(in.data(), DType::float32, out.data(), to, elements);
    benchmark::DoNotOptimize(out.data());
  }
  report(state, 6);
}
BENCHMARK_CAPTURE(BM_CastFromFloat32, Float16Scaled, DType::float16, 0.5)->Arg(0)->Arg(1);
BENCHMARK_CAPTURE(BM_CastFromFloat32, Float16, DType::float16, 0.0)->Arg(0)->Arg(1);
BENCHMARK_CAPTURE(BM_CastFromFloat32, Bfloat16, DType::bfloat16, 0.0)->Arg(0)->Arg(1);

// The hook's way back: the reduced float16 bucket widened into the float32 gradients.
void BM_CastFloat16ToFloat32(benchmark::State& state) {
  simd::ScopedIsa isa(isa_of(state));
  const std::vector<float> values = gradients();
  std::vector<loom::float16_t> in(elements);
  loom::kernels::cast(values.data(), DType::float32, in.data(), DType::float16, elements);
  std::vector<float> out(elements);
  for (auto _ : state) {
    loom::kernels::cast(in.data(), DType::float16, out.data(), DType::float32, elements);
    benchmark::DoNotOptimize(out.data());
  }
  report(state, 6);
}
BENCHMARK(BM_CastFloat16ToFloat32)->Arg(0)->Arg(1);

// What a CPU allreduce does with each received float16 chunk: one chunk plus another.
void BM_SumFloat16(benchmark::State& state) {
  simd::ScopedIsa isa(isa_of(state));
  const std::vector<float> values = gradients();
  std::vector<loom::float16_t> a(elements), b(elements), out(elements);
  loom::kernels::cast(values.data(), DType::float32, a.data(), DType::float16, elements);
  loom::kernels::cast(values.data(), DType::float32, b.data(), DType::float16, elements, -0.5);
  for (auto _ : state) {
    loom::kernels::reduce(out.data(), a.data(), b.data(), elements, DType::float16,
                          loom::ReduceOp::sum);
    benchmark::DoNotOptimize(out.data());
  }
  report(state, 6);
}
BENCHMARK(BM_SumFloat16)->Arg(0)->Arg(1);

}  // namespace

BENCHMARK_MAIN();
