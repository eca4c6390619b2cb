// The bad-input table: each row is a call loom must refuse with a loom::Error naming the
// problem, before anything is sent (so it cannot hang the other ranks). Shared by the local
// and MPI test binaries; needs a world of at least 2 ranks.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "loom/backend.hpp"
#include "loom/error.hpp"

namespace loom::testing {

struct BadInput {
  std::string name;
  std::function<void(Backend&)> call;
  ErrorCode code;
  std::string message_part;  ///< a piece of the message that names what was wrong
};

inline std::vector<BadInput> bad_inputs() {
  static std::vector<float> f(64);
  static std::vector<double> d(64);
  static std::vector<std::int32_t> i32(64);
  static std::vector<std::uint8_t> flags(64);
  auto fb = [](std::size_t n) { return Buffer(f.data(), n, DType::float32); };
  auto db = [](std::size_t n) { return Buffer(d.data(), n, DType::float64); };
  auto bb = [](std::size_t n) { return Buffer(flags.data(), n, DType::boolean); };
  // Eight float32 slots are four complex64 numbers.
  auto cb = [](std::size_t n) { return Buffer(f.data(), n, DType::complex64); };
  return {
      {"AllreduceDtypeMismatch", [=](Backend& b) { b.allreduce(fb(8), db(8), ReduceOp::sum); },
       ErrorCode::invalid_argument, "different dtypes"},
      {"AllreduceCountMismatch",
       [=](Backend& b) {
         b.allreduce(fb(8), Buffer(f.data() + 16, 9, DType::float32), ReduceOp::sum);
       },
       ErrorCode::invalid_argument, "recv count 9 differs from send count 8"},
      {"AllgatherRecvTooSmall",
       [=](Backend& b) { b.allgather(fb(4), Buffer(d.data(), 5, DType::float32)); },
       ErrorCode::invalid_argument, "recv count 5 must be send count 4"},
      {"ReduceScatterDtypeMismatch",
       [=](Backend& b) { b.reduce_scatter(fb(b.world_size() * 3 + 1), db(3), ReduceOp::sum); },
       ErrorCode::invalid_argument, "different dtypes"},
      {"ReduceScatterCountNotDivisibleByWorld",
       [=](Backend& b) {
         b.reduce_scatter(fb(b.world_size() * 3 + 1), Buffer(f.data() + 40, 3, DType::float32),
                          ReduceOp::sum);
       },
       ErrorCode::invalid_argument, "does not divide by"},
      {"BroadcastRootOutOfRange", [=](Backend& b) { b.broadcast(fb(4), b.world_size()); },
       ErrorCode::invalid_argument, "root"},
      {"ReduceNegativeRoot", [=](Backend& b) { b.reduce(fb(4), fb(4), ReduceOp::sum, -1); },
       ErrorCode::invalid_argument, "root -1 is out of range"},
      {"SendPeerOutOfRange", [=](Backend& b) { b.send(fb(4), b.world_size() + 3, 0); },
       ErrorCode::invalid_argument, "peer"},
      {"RecvNegativeTag", [=](Backend& b) { b.recv(fb(4), 0, -5); }, ErrorCode::invalid_argument,
       "tag -5 is out of range"},
      {"NullSendWithCount",
       [=](Backend& b) { b.allreduce(Buffer(nullptr, 10, DType::float32), fb(10), ReduceOp::sum); },
       ErrorCode::invalid_argument, "send buffer is null with count 10"},
      {"NullBroadcastWithCount",
       [=](Backend& b) { b.broadcast(Buffer(nullptr, 3, DType::int64), 0); },
       ErrorCode::invalid_argument, "buffer is null with count 3"},
      {"AvgOnBool", [=](Backend& b) { b.allreduce(bb(8), bb(8), ReduceOp::avg); },
       ErrorCode::unsupported, "avg is not defined for bool"},
      {"MaxOnComplex", [=](Backend& b) { b.allreduce(cb(4), cb(4), ReduceOp::max); },
       ErrorCode::unsupported, "max is not defined for complex64 (complex numbers are summed"},
      {"ProdOnComplex", [=](Backend& b) { b.reduce(cb(4), cb(4), ReduceOp::prod, 0); },
       ErrorCode::unsupported, "prod is not defined for complex64"},
      {"OverlappingOutOfPlace",
       [=](Backend& b) {
         b.allreduce(fb(8), Buffer(f.data() + 4, 8, DType::float32), ReduceOp::sum);
       },
       ErrorCode::invalid_argument, "overlap"},
      {"AlltoallCountNotDivisible",
       [=](Backend& b) {
         const std::size_t n = b.world_size() * 2 + 1;
         b.alltoall(fb(n), Buffer(f.data() + 32, n, DType::float32));
       },
       ErrorCode::invalid_argument, "does not divide by"},
      // cuda:999 is out of reach everywhere: no backend without CUDA takes a device buffer,
      // and no machine has that GPU (the mpi backend stages cuda:0 where it is visible).
      {"DeviceBufferOnCpuBackend",
       [=](Backend& b) {
         b.allreduce(Buffer(f.data(), 4, DType::float32, Device::cuda(999)),
                     Buffer(f.data() + 8, 4, DType::float32, Device::cuda(999)), ReduceOp::sum);
       },
       ErrorCode::unsupported, "cuda:999"},
  };
}

/// @brief Runs one row: the empty string when the right Error came, else what happened.
inline std::string provoke(Backend& backend, const BadInput& row) {
  try {
    row.call(backend);
  } catch (const Error& e) {
    if (e.code() != row.code)
      return row.name + ": code " + std::string(to_string(e.code())) + ", expected " +
             std::string(to_string(row.code)) + " (" + e.what() + ")";
    const std::string what = e.what();
    if (what.find(row.message_part) == std::string::npos)
      return row.name + ": message '" + what + "' does not contain '" + row.message_part + "'";
    if (what.find("rank " + std::to_string(backend.rank())) == std::string::npos)
      return row.name + ": message '" + what + "' does not name the rank";
    return {};
  } catch (const std::exception& e) {
    return row.name + ": threw a non-loom exception: " + e.what();
  }
  return row.name + ": no error was raised";
}

}  // namespace loom::testing
