// Pattern: per-rank inputs with exact results in every dtype, and the element-by-element check.
#include "pattern.hpp"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "layout.hpp"
#include "loom/error.hpp"

namespace loom::bench {
namespace {

// The largest integer below which every integer is exact in `dtype` (sums of non-negative
// integers up to it are then exact in any order).
std::int64_t exact_limit(DType dtype) {
  switch (dtype) {
    case DType::float16:
      return 2048;
    case DType::bfloat16:
      return 256;
    case DType::uint8:
      return 255;
    case DType::int8:
      return 127;
    case DType::int16:
      return 32767;
    case DType::boolean:
      return 1;
    case DType::float32:
    case DType::complex64:
      return std::int64_t{1} << 24;
    default:
      return std::int64_t{1} << 31;
  }
}

// Calls f(std::type_identity<T>{}) with T the element type of `dtype`: a complex number is two
// of its real type (lanes() of them per element), a bool one uint8 holding 0 or 1.
template <class F>
decltype(auto) with_element_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::float32:
      return f(std::type_identity<float>{});
    case DType::float64:
      return f(std::type_identity<double>{});
    case DType::float16:
      return f(std::type_identity<float16_t>{});
    case DType::bfloat16:
      return f(std::type_identity<bfloat16_t>{});
    case DType::int32:
      return f(std::type_identity<std::int32_t>{});
    case DType::int64:
      return f(std::type_identity<std::int64_t>{});
    case DType::uint8:
    case DType::boolean:
      return f(std::type_identity<std::uint8_t>{});
    case DType::int8:
      return f(std::type_identity<std::int8_t>{});
    case DType::int16:
      return f(std::type_identity<std::int16_t>{});
    case DType::complex64:
      return f(std::type_identity<float>{});
    case DType::complex128:
      return f(std::type_identity<double>{});
  }
  throw Error(ErrorCode::internal, "unknown dtype");
}

// Values of with_element_type's T per element: both halves of a complex number hold the same
// integer, so a component-wise sum or average gives it in both.
std::size_t lanes(DType dtype) {
  return is_complex(dtype) ? 2 : 1;
}

template <class T>
T from_integer(std::int64_t value) {
  if constexpr (std::is_same_v<T, float16_t>)
    return to_float16(static_cast<float>(value));
  else if constexpr (std::is_same_v<T, bfloat16_t>)
    return to_bfloat16(static_cast<float>(value));
  else
    return static_cast<T>(value);
}

template <class T>
double to_double(T value) {
  if constexpr (std::is_same_v<T, float16_t> || std::is_same_v<T, bfloat16_t>)
    return to_float(value);
  else
    return static_cast<double>(value);
}

}  // namespace

Pattern::Pattern(Collective collective, DType dtype, ReduceOp op, int ranks, int root)
    : _collective(collective), _dtype(dtype), _op(op), _ranks(ranks), _root(root) {
  const std::int64_t per_rank = exact_limit(dtype) / ranks;
  if (!reduces(collective)) {
    _modulus = 251;  // a prime below every limit, so that ranks' inputs differ
  } else if (op == ReduceOp::sum) {
    _modulus = std::clamp<std::int64_t>(per_rank, 0, 10) + 1;
  } else if (op == ReduceOp::avg) {
    // One rank adds `ranks` on top, so the sum is ranks x (base + 1).
    _modulus = std::clamp<std::int64_t>(per_rank - 1, 0, 10) + 1;
  } else {
    _modulus = 11;
  }
}

std::int64_t Pattern::input(int rank, std::size_t index) const {
  const auto i = static_cast<std::int64_t>(index);
  const auto r = static_cast<std::int64_t>(rank);
  const bool chosen = (i + r) % _ranks == 0;                 // exactly one rank per index
  if (_dtype == DType::boolean) return (i + 3 * r) % 5 < 3;  // or and and both vary
  if (!reduces(_collective)) return (31 * r + i) % _modulus;
  switch (_op) {
    case ReduceOp::prod:
      return chosen ? 2 + i % 2 : 1;
    case ReduceOp::avg:
      return i % _modulus + (chosen ? _ranks : 0);
    default:
      return (i + 3 * r) % _modulus;
  }
}

std::int64_t Pattern::reduced(std::size_t index) const {
  std::int64_t result = input(0, index);
  for (int rank = 1; rank < _ranks; ++rank) {
    const std::int64_t value = input(rank, index);
    if (_dtype == DType::boolean) {  // sum and max: logical or; prod and min: logical and
      const bool any = _op == ReduceOp::sum || _op == ReduceOp::max;
      result = any ? (result | value) : (result & value);
      continue;
    }
    switch (_op) {
      case ReduceOp::sum:
      case ReduceOp::avg:
        result += value;
        break;
      case ReduceOp::prod:
        result *= value;
        break;
      case ReduceOp::min:
        result = std::min(result, value);
        break;
      case ReduceOp::max:
        result = std::max(result, value);
        break;
    }
  }
  // avg: the sums are multiples of the rank count, so the quotient is exact in every dtype
  // (integers divide with truncation, which changes nothing here).
  return _op == ReduceOp::avg ? result / _ranks : result;
}

void Pattern::fill(int rank, Buffer send, Buffer recv) const {
  std::memset(recv.data(), 0xA5, recv.bytes());
  const Buffer inputs = _collective == Collective::broadcast ? recv : send;
  with_element_type(_dtype, [&]<class T>(std::type_identity<T>) {
    T* data = static_cast<T*>(inputs.data());
    const std::size_t k = lanes(_dtype);
    for (std::size_t i = 0; i < inputs.count(); ++i)
      for (std::size_t lane = 0; lane < k; ++lane)
        data[i * k + lane] = from_integer<T>(input(rank, i));
  });
}

std::uint64_t Pattern::count_wrong(int rank, Buffer recv) const {
  if (_collective == Collective::reduce && rank != _root) return 0;  // no result there
  const std::size_t count = recv.count();
  const auto ranks = static_cast<std::size_t>(_ranks);
  auto expected = [&](std::size_t i) -> std::int64_t {
    switch (_collective) {
      case Collective::broadcast:
        return input(_root, i);
      case Collective::allgather:  // block j came from rank j
        return input(static_cast<int>(i / (count / ranks)), i % (count / ranks));
      case Collective::alltoall: {  // block j is rank j's block number `rank`
        const std::size_t block = count / ranks;
        return input(static_cast<int>(i / block), rank * block + i % block);
      }
      case Collective::reduce_scatter:
        return reduced(rank * count + i);
      default:
        return reduced(i);
    }
  };
  return with_element_type(_dtype, [&]<class T>(std::type_identity<T>) {
    const T* data = static_cast<const T*>(recv.data());
    const std::size_t k = lanes(_dtype);
    std::uint64_t wrong = 0;
    for (std::size_t i = 0; i < count; ++i) {
      const double want = to_double(from_integer<T>(expected(i)));
      bool right = true;
      for (std::size_t lane = 0; lane < k; ++lane)
        right = right && to_double(data[i * k + lane]) == want;
      if (!right) ++wrong;
    }
    return wrong;
  });
}

}  // namespace loom::bench
