// Reference values for the collective checks: computed in double from the same generator on
// every rank, so a wrong element can be named exactly.
#include "backends/collective_checks.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>

namespace loom::testing {
namespace {

bool reduces(Collective op) {
  return op == Collective::reduce || op == Collective::allreduce ||
         op == Collective::reduce_scatter;
}

// Inputs chosen so every result is exact in every dtype: products of values in {1, 2} over at
// most 5 ranks stay <= 32, sums of values in [-3, 6] stay within int8/uint8/bfloat16's exact
// range. bool takes 0 and 1 (about 40% true, so that both or and and give both values).
// A complex dtype is checked as its real halves: `dtype` here is then real_dtype() of it and i
// counts halves (real, imaginary, real, ...).
double input(int rank, std::size_t i, DType dtype, ReduceOp op) {
  if (dtype == DType::boolean) return (i * 7 + static_cast<std::size_t>(rank) * 3) % 5 < 2;
  if (op == ReduceOp::prod) return ((i + static_cast<std::size_t>(rank)) % 3 == 0) ? 2.0 : 1.0;
  const double base = static_cast<double>((i * 3 + static_cast<std::size_t>(rank) * 5) % 10);
  return dtype == DType::uint8 ? base : base - 3.0;
}

void store(void* data, std::size_t i, DType dtype, double v) {
  switch (dtype) {
    case DType::float32:
      static_cast<float*>(data)[i] = static_cast<float>(v);
      return;
    case DType::float64:
      static_cast<double*>(data)[i] = v;
      return;
    case DType::float16:
      static_cast<float16_t*>(data)[i] = to_float16(static_cast<float>(v));
      return;
    case DType::bfloat16:
      static_cast<bfloat16_t*>(data)[i] = to_bfloat16(static_cast<float>(v));
      return;
    case DType::int32:
      static_cast<std::int32_t*>(data)[i] = static_cast<std::int32_t>(v);
      return;
    case DType::int64:
      static_cast<std::int64_t*>(data)[i] = static_cast<std::int64_t>(v);
      return;
    case DType::uint8:
    case DType::boolean:
      static_cast<std::uint8_t*>(data)[i] = static_cast<std::uint8_t>(v);
      return;
    case DType::int8:
      static_cast<std::int8_t*>(data)[i] = static_cast<std::int8_t>(v);
      return;
    case DType::int16:
      static_cast<std::int16_t*>(data)[i] = static_cast<std::int16_t>(v);
      return;
    case DType::complex64:
    case DType::complex128:
      break;  // stored as their halves (real_dtype)
  }
}

double load(const void* data, std::size_t i, DType dtype) {
  switch (dtype) {
    case DType::float32:
      return static_cast<const float*>(data)[i];
    case DType::float64:
      return static_cast<const double*>(data)[i];
    case DType::float16:
      return to_float(static_cast<const float16_t*>(data)[i]);
    case DType::bfloat16:
      return to_float(static_cast<const bfloat16_t*>(data)[i]);
    case DType::int32:
      return static_cast<const std::int32_t*>(data)[i];
    case DType::int64:
      return static_cast<const std::int64_t*>(data)[i];
    case DType::uint8:
    case DType::boolean:
      return static_cast<const std::uint8_t*>(data)[i];
    case DType::int8:
      return static_cast<const std::int8_t*>(data)[i];
    case DType::int16:
      return static_cast<const std::int16_t*>(data)[i];
    case DType::complex64:
    case DType::complex128:
      break;  // loaded as their halves (real_dtype)
  }
  return 0;
}

// The reduction over ranks of input(r, i), rounded to the dtype as loom must deliver it.
double reduced(int world, std::size_t i, DType dtype, ReduceOp op) {
  double acc = input(0, i, dtype, op);
  for (int r = 1; r < world; ++r) {
    const double v = input(r, i, dtype, op);
    if (dtype == DType::boolean) {  // sum and max: logical or; prod and min: logical and
      const bool any = op == ReduceOp::sum || op == ReduceOp::max;
      acc = any ? (acc != 0 || v != 0) : (acc != 0 && v != 0);
      continue;
    }
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg:
        acc += v;
        break;
      case ReduceOp::prod:
        acc *= v;
        break;
      case ReduceOp::min:
        acc = std::min(acc, v);
        break;
      case ReduceOp::max:
        acc = std::max(acc, v);
        break;
    }
  }
  // avg on integers: the sum divided with truncation toward zero (ncclAvg's definition).
  if (op == ReduceOp::avg) acc = is_integer(dtype) ? std::trunc(acc / world) : acc / world;
  return acc;
}

double tolerance(DType dtype, ReduceOp op, double expected) {
  if (op != ReduceOp::avg) return 0;  // everything else is exact by construction
  const double scale = std::max(1.0, std::abs(expected));
  switch (dtype) {
    case DType::float16:
      return scale * 1e-3;
    case DType::bfloat16:
      return scale * 8e-3;
    case DType::float32:
      return scale * 1e-6;
    default:
      return scale * 1e-12;
  }
}

struct Tally {
  std::size_t wrong = 0;
  std::string first;
  void expect(const char* what, std::size_t i, double got, double want, double tol) {
    if (std::abs(got - want) <= tol || (std::isnan(got) && std::isnan(want))) return;
    if (wrong++ == 0) {
      std::ostringstream s;
      s << what << "[" << i << "] = " << got << ", expected " << want;
      first = s.str();
    }
  }
  std::string result(const std::string& context) const {
    if (wrong == 0) return {};
    return context + ": " + std::to_string(wrong) + " wrong, first " + first;
  }
};

struct Storage {
  Storage(std::size_t count, DType dtype) : bytes(count * dtype_size(dtype)), buffer() {
    buffer = Buffer(bytes.empty() ? nullptr : bytes.data(), count, dtype);
  }
  std::vector<std::byte> bytes;
  Buffer buffer;
};

}  // namespace

std::string describe(const Case& c) {
  return std::string(to_string(c.op)) + " " + std::string(to_string(c.dtype)) + " " +
         std::string(to_string(c.redop)) + " count " + std::to_string(c.count) +
         (c.in_place ? " in-place" : "");
}

std::vector<Case> cases_for(Collective op, DType dtype, const std::vector<std::size_t>& counts) {
  std::vector<Case> cases;
  std::vector<ReduceOp> ops{ReduceOp::sum};
  if (reduces(op)) {
    ops.clear();
    for (ReduceOp r : all_reduce_ops)
      if (supports(r, dtype)) ops.push_back(r);
  }
  const bool has_in_place =
      op == Collective::allreduce || op == Collective::allgather || op == Collective::reduce;
  bool size_covered = dtype == DType::int8 || dtype == DType::int16 || dtype == DType::boolean ||
                      dtype == DType::complex64;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // Instrumented builds: one type of each width at full length (see cases_for's comment).
  size_covered =
      size_covered || dtype == DType::bfloat16 || dtype == DType::int32 || dtype == DType::int64;
#endif
  for (ReduceOp r : ops)
    for (std::size_t count : counts) {
      if (size_covered) count = std::min(count, element_size_covered_count);
      cases.push_back({op, dtype, r, count, false});
      if (has_in_place) cases.push_back({op, dtype, r, count, true});
    }
  return cases;
}

std::string check(Backend& backend, const Case& c) {
  const int world = backend.world_size();
  const int rank = backend.rank();
  const auto n = static_cast<std::size_t>(world);
  const std::string context = describe(c) + " on rank " + std::to_string(rank) + " of " +
                              std::to_string(world) + " (" + std::string(backend.name()) + ")";
  // Buffers hold c.count elements of c.dtype; values are written and checked as `count`
  // scalars of `dt` (a complex element is two).
  const DType dt = real_dtype(c.dtype);
  const std::size_t count = is_complex(c.dtype) ? 2 * c.count : c.count;
  Tally tally;
  switch (c.op) {
    case Collective::barrier: {
      backend.barrier();
      return {};
    }
    case Collective::broadcast: {
      const int root = world - 1;
      Storage buf(c.count, c.dtype);
      for (std::size_t i = 0; i < count; ++i)
        store(buf.buffer.data(), i, dt, rank == root ? input(root, i, dt, c.redop) : 99);
      backend.broadcast(buf.buffer, root);
      for (std::size_t i = 0; i < count; ++i)
        tally.expect("buffer", i, load(buf.buffer.data(), i, dt), input(root, i, dt, c.redop), 0);
      break;
    }
    case Collective::reduce:
    case Collective::allreduce: {
      const int root = c.op == Collective::reduce ? (world > 2 ? 1 : 0) : 0;
      Storage send(c.count, c.dtype), recv(c.count, c.dtype);
      for (std::size_t i = 0; i < count; ++i) {
        store(send.buffer.data(), i, dt, input(rank, i, dt, c.redop));
        store(recv.buffer.data(), i, dt, 99);
      }
      Buffer out = c.in_place ? send.buffer : recv.buffer;
      if (c.op == Collective::reduce)
        backend.reduce(send.buffer, out, c.redop, root);
      else
        backend.allreduce(send.buffer, out, c.redop);
      if (c.op == Collective::reduce && rank != root) {
        // Non-roots' buffers must be untouched.
        for (std::size_t i = 0; i < count; ++i)
          tally.expect(c.in_place ? "send" : "recv", i, load(out.data(), i, dt),
                       c.in_place ? input(rank, i, dt, c.redop) : 99, 0);
        break;
      }
      for (std::size_t i = 0; i < count; ++i) {
        const double want = reduced(world, i, dt, c.redop);
        tally.expect("result", i, load(out.data(), i, dt), want, tolerance(dt, c.redop, want));
      }
      break;
    }
    case Collective::allgather: {
      Storage send(c.count, c.dtype), recv(c.count * n, c.dtype);
      for (std::size_t i = 0; i < count * n; ++i) store(recv.buffer.data(), i, dt, 99);
      Buffer in = c.in_place ? recv.buffer.slice(rank * c.count, c.count) : send.buffer;
      for (std::size_t i = 0; i < count; ++i) store(in.data(), i, dt, input(rank, i, dt, c.redop));
      backend.allgather(in, recv.buffer);
      for (int r = 0; r < world; ++r)
        for (std::size_t i = 0; i < count; ++i)
          tally.expect("recv", r * count + i, load(recv.buffer.data(), r * count + i, dt),
                       input(r, i, dt, c.redop), 0);
      break;
    }
    case Collective::reduce_scatter: {
      Storage send(c.count * n, c.dtype), recv(c.count, c.dtype);
      for (std::size_t i = 0; i < count * n; ++i)
        store(send.buffer.data(), i, dt, input(rank, i, dt, c.redop));
      backend.reduce_scatter(send.buffer, recv.buffer, c.redop);
      for (std::size_t i = 0; i < count; ++i) {
        const double want = reduced(world, rank * count + i, dt, c.redop);
        tally.expect("recv", i, load(recv.buffer.data(), i, dt), want,
                     tolerance(dt, c.redop, want));
      }
      break;
    }
    case Collective::alltoall: {
      // Block j of rank r's send holds input(r, j * count + i); rank r receives block r of
      // every rank j at position j.
      Storage send(c.count * n, c.dtype), recv(c.count * n, c.dtype);
      for (std::size_t i = 0; i < count * n; ++i)
        store(send.buffer.data(), i, dt, input(rank, i, dt, c.redop));
      backend.alltoall(send.buffer, recv.buffer);
      for (int j = 0; j < world; ++j)
        for (std::size_t i = 0; i < count; ++i)
          tally.expect("recv", j * count + i, load(recv.buffer.data(), j * count + i, dt),
                       input(j, rank * count + i, dt, c.redop), 0);
      break;
    }
  }
  return tally.result(context);
}

std::string check_point_to_point(Backend& backend, DType dtype, std::size_t elements) {
  const int world = backend.world_size();
  const int rank = backend.rank();
  const int next = (rank + 1) % world;
  const int prev = (rank + world - 1) % world;
  // As check(): a complex element is checked as two scalars of its real type.
  const DType dt = real_dtype(dtype);
  const std::size_t halves = is_complex(dtype) ? 2 : 1;
  const std::size_t count = elements * halves;
  const std::string context = "point-to-point " + std::string(to_string(dtype)) + " count " +
                              std::to_string(elements) + " on rank " + std::to_string(rank) +
                              " of " + std::to_string(world) + " (" + std::string(backend.name()) +
                              ")";
  Tally tally;
  // Known size: post the receive first, then send, then wait for both (works on one rank too).
  Storage send(elements, dtype), recv(elements, dtype);
  for (std::size_t i = 0; i < count; ++i)
    store(send.buffer.data(), i, dt, input(rank, i, dt, ReduceOp::sum));
  auto r = backend.recv_async(recv.buffer, prev, 7);
  auto s = backend.send_async(send.buffer, next, 7);
  r->wait();
  s->wait();
  for (std::size_t i = 0; i < count; ++i)
    tally.expect("recv", i, load(recv.buffer.data(), i, dt), input(prev, i, dt, ReduceOp::sum), 0);

  // Unknown size: each rank sends count + rank elements; the receiver probes for the size.
  const std::size_t mine = elements + static_cast<std::size_t>(rank);
  Storage varied(mine, dtype);
  for (std::size_t i = 0; i < mine * halves; ++i)
    store(varied.buffer.data(), i, dt, input(rank + 1, i, dt, ReduceOp::sum));
  auto s2 = backend.send_async(varied.buffer, next, 9);
  const Status status = backend.probe(prev, 9);
  const std::size_t theirs = elements + static_cast<std::size_t>(prev);
  if (status.source != prev || status.tag != 9 || status.bytes != theirs * dtype_size(dtype))
    return context + ": probe saw source " + std::to_string(status.source) + " tag " +
           std::to_string(status.tag) + " bytes " + std::to_string(status.bytes) +
           ", expected source " + std::to_string(prev) + " tag 9 bytes " +
           std::to_string(theirs * dtype_size(dtype));
  Message message = backend.recv_message(any_source, 9);
  s2->wait();
  if (message.source != prev || message.data.size() != theirs * dtype_size(dtype))
    return context + ": recv_message got " + std::to_string(message.data.size()) +
           " bytes from rank " + std::to_string(message.source);
  for (std::size_t i = 0; i < theirs * halves; ++i)
    tally.expect("message", i, load(message.data.data(), i, dt),
                 input(prev + 1, i, dt, ReduceOp::sum), 0);
  return tally.result(context);
}

}  // namespace loom::testing
