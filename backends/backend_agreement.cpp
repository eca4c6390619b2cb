// Backend: the ranks' agreement checks (exchange_int64, agree_on_root): collectives waited for
// with a deadline, whose buffers outlive an abandoned wait.
#include "loom/backend.hpp"

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/error.hpp"

namespace loom {
namespace {

// Memory an abandoned operation may still use: kept until the process ends, from a list that is
// never destroyed (so leak checkers see it reachable).
void keep_until_exit(std::shared_ptr<void> memory) {
  static std::mutex mutex;
  static auto* kept = new std::vector<std::shared_ptr<void>>();
  std::lock_guard lock(mutex);
  kept->push_back(std::move(memory));
}

// Runs collective `args`, recorded as `name`, waiting at most `limit` (wait_or_abandon, the
// error naming it by what()); at the deadline the abandoned collective may still use `memory`,
// which is then kept until the process ends.
void run_keeping(Backend& backend, const CollectiveArgs& args, std::string_view name,
                 std::chrono::nanoseconds limit, const std::function<std::string()>& what,
                 std::shared_ptr<void> memory) {
  Backend::OperationRecord operation;
  auto work = backend.collective_async(args, name, &operation);
  try {
    backend.wait_or_abandon(
        *work, [&] { return what() + " (collective #" + std::to_string(operation.seq) + ")"; },
        operation.seq, limit);
  } catch (...) {
    keep_until_exit(std::move(memory));
    throw;
  }
}

}  // namespace

std::vector<std::int64_t> Backend::exchange_int64(std::string_view name,
                                                  std::span<const std::int64_t> mine,
                                                  std::chrono::nanoseconds limit,
                                                  const std::function<std::string()>& what) {
  using Vector = std::vector<std::int64_t>;
  // On the heap: abandoned at the deadline, the allgather may still read and write them.
  auto buffers = std::make_shared<std::pair<Vector, Vector>>(
      Vector(mine.begin(), mine.end()),
      Vector(mine.size() * static_cast<std::size_t>(world_size())));
  Vector& send = buffers->first;  // named references: a lambda may not capture a binding
  Vector& recv = buffers->second;
  run_keeping(*this,
              {Collective::allgather, Buffer::of(std::span(send)), Buffer::of(std::span(recv)),
               ReduceOp::sum, 0},
              name, limit, what, buffers);
  return std::move(recv);
}

std::vector<std::int64_t> Backend::agree_on_root(std::string_view name,
                                                 std::span<const std::int64_t> mine,
                                                 std::chrono::nanoseconds limit,
                                                 const std::function<std::string()>& what,
                                                 bool same_length) {
  const std::int64_t length = static_cast<std::int64_t>(mine.size());
  const std::vector<std::int64_t> lengths =
      exchange_int64(name, std::span(&length, 1), limit, what);
  const auto [low, high] = std::minmax_element(lengths.begin(), lengths.end());
  if (same_length && *low != *high)
    throw Error(ErrorCode::mismatch, what() + ": ranks hold between " + std::to_string(*low) +
                                         " and " + std::to_string(*high) + " values (this rank " +
                                         std::to_string(length) + ")");
  if (lengths.front() == 0) return {};
  // On the heap: abandoned at the deadline, the broadcast may still write it.
  auto values = std::make_shared<std::vector<std::int64_t>>(
      rank() == 0 ? std::vector<std::int64_t>(mine.begin(), mine.end())
                  : std::vector<std::int64_t>(static_cast<std::size_t>(lengths.front())));
  const Buffer buffer = Buffer::of(std::span(*values));
  run_keeping(*this, {Collective::broadcast, buffer, buffer, ReduceOp::sum, 0}, name, limit, what,
              values);
  return *values;
}

}  // namespace loom
