// Fuzzes the CPU reduction kernels over every DType x ReduceOp (the kernel every backend and
// algorithm reduces with): the input picks the dtype, the op, a split point and a divisor, and
// its remaining bytes are the two operands, any bit patterns (NaNs, negative zeros, bools that
// are neither 0 nor 1). The contracts checked:
// - an op the dtype does not have (supports() false) is ErrorCode::unsupported naming both;
// - out of place equals in place, and reducing [0, k) and [k, n) apart equals reducing [0, n)
//   (the vectorised and the scalar loops meet at every split), byte for byte;
// - integers and bool are commutative byte for byte; bool results are 0 or 1;
// - avg's division: integers truncate toward zero (checked against int64 arithmetic here),
//   bool is refused by name.
#include <algorithm>
#include <cstring>
#include <vector>

#include "fuzz/fuzz_env.hpp"
#include "loom/dtype.hpp"
#include "loom/error.hpp"
#include "loom/kernels/reduce.hpp"

namespace {

using loom::DType;
using loom::ReduceOp;
using loom::fuzz::contains;
using loom::fuzz::contract_broken;

std::string label(DType dtype, ReduceOp op, std::size_t n) {
  return std::string(loom::to_string(op)) + " on " + std::string(loom::to_string(dtype)) + " x " +
         std::to_string(n);
}

std::int64_t integer_at(const std::byte* p, std::size_t i, DType dtype) {
  switch (dtype) {
    case DType::int8:
      return reinterpret_cast<const std::int8_t*>(p)[i];
    case DType::int16:
      return reinterpret_cast<const std::int16_t*>(p)[i];
    case DType::int32:
      return reinterpret_cast<const std::int32_t*>(p)[i];
    case DType::uint8:
      return reinterpret_cast<const std::uint8_t*>(p)[i];
    default:
      return reinterpret_cast<const std::int64_t*>(p)[i];
  }
}

void check_average(DType dtype, const std::vector<std::byte>& sum, std::size_t n, int divisor) {
  std::vector<std::byte> avg = sum;
  if (dtype == DType::boolean) {
    try {
      loom::kernels::average(avg.data(), n, dtype, divisor);
      contract_broken("avg on bool was accepted", label(dtype, ReduceOp::avg, n));
    } catch (const loom::Error& e) {
      if (e.code() != loom::ErrorCode::unsupported || !contains(e.message(), "bool"))
        contract_broken("avg on bool refused with " + e.message(), label(dtype, ReduceOp::avg, n));
    }
    return;
  }
  loom::kernels::average(avg.data(), n, dtype, divisor);
  if (!loom::is_integer(dtype)) return;
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t s = integer_at(sum.data(), i, dtype), q = integer_at(avg.data(), i, dtype);
    // int64's own division truncates toward zero; INT64_MIN / -1 cannot occur (divisor > 0).
    if (q != s / divisor)
      contract_broken(
          std::to_string(s) + " / " + std::to_string(divisor) + " gave " + std::to_string(q),
          label(dtype, ReduceOp::avg, n));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 4) return 0;
  const DType dtype = loom::all_dtypes[data[0] % std::size(loom::all_dtypes)];
  const ReduceOp op = loom::all_reduce_ops[data[1] % std::size(loom::all_reduce_ops)];
  const int divisor = 1 + data[3] % 7;
  const std::size_t element = loom::dtype_size(dtype);
  const std::size_t n = (size - 4) / 2 / element;
  const std::size_t split = n == 0 ? 0 : data[2] % (n + 1);
  std::vector<std::byte> a(n * element), b(n * element);
  if (n > 0) {
    std::memcpy(a.data(), data + 4, a.size());
    std::memcpy(b.data(), data + 4 + a.size(), b.size());
  }
  const std::string what = label(dtype, op, n);

  std::vector<std::byte> out(a.size());
  if (!loom::supports(op, dtype)) {
    try {
      loom::kernels::reduce(out.data(), a.data(), b.data(), n, dtype, op);
      contract_broken("an op the dtype does not have was accepted", what);
    } catch (const loom::Error& e) {
      if (e.code() != loom::ErrorCode::unsupported ||
          !contains(e.message(), std::string(loom::to_string(op)) + " is not defined for " +
                                     std::string(loom::to_string(dtype))))
        contract_broken("refused with " + e.message(), what);
    }
    return 0;
  }
  loom::kernels::reduce(out.data(), a.data(), b.data(), n, dtype, op);

  std::vector<std::byte> in_place = a;
  loom::kernels::reduce(in_place.data(), b.data(), n, dtype, op);
  if (in_place != out) contract_broken("in place differs from out of place", what);

  std::vector<std::byte> pieces(a.size());
  const std::size_t tail = split * element;
  loom::kernels::reduce(pieces.data(), a.data(), b.data(), split, dtype, op);
  loom::kernels::reduce(pieces.data() + tail, a.data() + tail, b.data() + tail, n - split, dtype,
                        op);
  if (pieces != out)
    contract_broken("split at " + std::to_string(split) + " differs from whole", what);

  if (loom::is_integer(dtype) || dtype == DType::boolean) {
    std::vector<std::byte> swapped(a.size());
    loom::kernels::reduce(swapped.data(), b.data(), a.data(), n, dtype, op);
    if (swapped != out) contract_broken("not commutative", what);
  }
  if (dtype == DType::boolean && std::any_of(out.begin(), out.end(), [](std::byte v) {
        return v != std::byte{0} && v != std::byte{1};
      }))
    contract_broken("a bool result is neither 0 nor 1", what);
  if (op == ReduceOp::sum) check_average(dtype, out, n, divisor);
  return 0;
}
