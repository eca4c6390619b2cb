// StepwiseAlgorithm: posting, testing and finishing the steps of an algorithm; shared helpers.
#include "stepwise_algorithm.hpp"

#include <algorithm>
#include <cstring>
#include <mutex>

#include "loom/error.hpp"
#include "loom/kernels/reduce.hpp"

namespace loom::algorithms {

Range block_of(std::size_t count, int parts, int index) noexcept {
  const auto n = static_cast<std::size_t>(parts);
  const auto i = static_cast<std::size_t>(index);
  const std::size_t base = count / n;
  const std::size_t extra = count % n;
  return {i * base + std::min(i, extra), base + (i < extra ? 1 : 0)};
}

int power_of_two_below(int n) noexcept {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

void copy(Buffer dst, Buffer src) {
  if (src.bytes() != 0 && dst.data() != src.data())
    std::memcpy(dst.data(), src.data(), src.bytes());
}

namespace {
// Scratch blocks are plain host memory reused across calls: locking them would only spend
// RLIMIT_MEMLOCK on memory no device reads. The cap bounds what idle algorithms keep.
PinnedPool& scratch_pool() {
  static PinnedPool pool(PinnedPool::Options{std::size_t{4} << 30, false});
  return pool;
}
}  // namespace

std::string WorkLabel::where() const {
  return Backend::where(to_string(op), rank, world, backend);
}

std::string WorkLabel::describe() const {
  std::string text = where() + ": " + std::string(to_string(algorithm)) + " " + send.describe();
  if (op != Collective::broadcast && op != Collective::allgather)
    text += " " + std::string(to_string(reduce_op));
  return text;
}

ChannelWork::ChannelWork(Backend& backend, const WorkLabel& label)
    : _label(label),
      _backend(backend),
      _rank(backend.rank()),
      _world(backend.world_size()),
      _tag(backend.next_algorithm_tag()) {}

namespace {
// A transfer of an algorithm: polls the real one, and abandons it before destroying it once
// the algorithm was abandoned (the algorithm owns its transfers through this handle).
class Transfer final : public Work {
 public:
  // `abandon` is the algorithm's flag: the algorithm's own members hold its transfers, so they
  // are destroyed before it.
  Transfer(std::unique_ptr<Work> inner, const std::atomic<bool>& abandon)
      : _inner(std::move(inner)), _abandon(abandon) {}
  ~Transfer() override {
    if (_abandon.load(std::memory_order_acquire)) _inner->abandon();
  }

 protected:
  std::string describe() const override { return _inner->description(); }
  bool poll() override {
    if (!_inner->test()) return false;
    if (_inner->failed()) std::rethrow_exception(_inner->error());
    return true;
  }
  void on_abandon() noexcept override { _inner->abandon(); }

 private:
  std::unique_ptr<Work> _inner;
  const std::atomic<bool>& _abandon;
};

// Scratch of abandoned algorithms: reachable (not a leak to LeakSanitizer), never reused.
std::mutex abandoned_scratch_mutex;
std::vector<PinnedBlock>& abandoned_scratch() {
  static auto* blocks = new std::vector<PinnedBlock>();
  return *blocks;
}
}  // namespace

ChannelWork::~ChannelWork() {
  if (!abandoned() || _scratch.empty()) return;
  std::lock_guard lock(abandoned_scratch_mutex);
  for (auto& block : _scratch) abandoned_scratch().push_back(std::move(block));
}

void ChannelWork::on_abandon() noexcept {
  _abandon.store(true, std::memory_order_release);
}

std::unique_ptr<Work> ChannelWork::start_send(Buffer buffer, int peer) {
  return std::make_unique<Transfer>(_backend.algorithm_send_async(buffer, peer, _tag), _abandon);
}

std::unique_ptr<Work> ChannelWork::start_recv(Buffer buffer, int peer) {
  return std::make_unique<Transfer>(_backend.algorithm_recv_async(buffer, peer, _tag), _abandon);
}

Buffer ChannelWork::scratch(std::size_t count, DType dtype) {
  if (count == 0) return Buffer(nullptr, 0, dtype);
  _scratch.push_back(scratch_pool().acquire(count * dtype_size(dtype)));
  return Buffer(_scratch.back().data(), count, dtype);
}

bool ChannelWork::done(Work& transfer) {
  if (!transfer.test()) return false;
  if (transfer.failed()) std::rethrow_exception(transfer.error());
  return true;
}

bool ChannelWork::done_in_collective(Work& transfer) const {
  try {
    return done(transfer);
  } catch (const Error& e) {
    // The transfer's error names a message ("ucx recv of 8 bytes from rank 2 ..."); the
    // collective it belongs to comes first, as every other failure of the collective reads.
    throw Error(e.code(), _label.describe() + ": " + e.message());
  }
}

void ChannelWork::combine(Buffer inout, Buffer in, ReduceOp op) const {
  if (inout.count() != 0)
    kernels::reduce(inout.data(), in.data(), inout.count(), inout.dtype(), op);
}

void ChannelWork::combine(Buffer out, Buffer a, Buffer b, ReduceOp op) const {
  if (out.count() != 0)
    kernels::reduce(out.data(), a.data(), b.data(), out.count(), out.dtype(), op);
}

void ChannelWork::finish_average(Buffer result, ReduceOp op) const {
  if (op == ReduceOp::avg && result.count() != 0)
    kernels::average(result.data(), result.count(), result.dtype(), _world);
}

void StepwiseAlgorithm::send(Buffer buffer, int peer) {
  if (buffer.count() != 0) _transfers.push_back(start_send(buffer, peer));
}

void StepwiseAlgorithm::recv(Buffer buffer, int peer) {
  if (buffer.count() != 0) _transfers.push_back(start_recv(buffer, peer));
}

bool StepwiseAlgorithm::poll() {
  for (;;) {
    if (!_in_step) {
      if (!begin_step(_step)) return true;
      _in_step = true;
    }
    for (auto& transfer : _transfers)
      if (!done_in_collective(*transfer)) return false;
    _transfers.clear();
    end_step(_step);
    _in_step = false;
    ++_step;
  }
}

}  // namespace loom::algorithms
