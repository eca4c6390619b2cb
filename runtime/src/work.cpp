// Work: polling, back-off waiting and error capture shared by every backend's handles.
#include "loom/work.hpp"

#include <thread>

#include "loom/error.hpp"

namespace loom {

Work::Work(std::string description) : _description(std::move(description)) {}

Work::~Work() = default;

namespace {
std::atomic<std::uint64_t> abandoned_count{0};
}  // namespace

std::uint64_t abandoned_operations() noexcept {
  return abandoned_count.load(std::memory_order_acquire);
}

void note_abandoned_operation() noexcept {
  abandoned_count.fetch_add(1, std::memory_order_acq_rel);
}

void Work::abandon() noexcept {
  if (_abandoned.exchange(true, std::memory_order_acq_rel)) return;
  // Serialised with poll(): a composite work's transfers are not touched while it runs.
  std::lock_guard lock(_mutex);
  on_abandon();
}

const std::string& Work::description() const noexcept {
  std::call_once(_described, [this] {
    if (_description.empty()) _description = describe();
  });
  return _description;
}

bool Work::test() noexcept {
  if (finished()) return true;
  std::lock_guard lock(_mutex);
  if (finished()) return true;
  try {
    if (!poll()) return false;
  } catch (const Error&) {
    _error = std::current_exception();
  } catch (const std::exception& e) {
    _error =
        std::make_exception_ptr(Error(ErrorCode::internal, description() + " failed: " + e.what()));
  } catch (...) {
    _error = std::make_exception_ptr(
        Error(ErrorCode::internal, description() + " failed with an unknown exception"));
  }
  _finished.store(true, std::memory_order_release);
  return true;
}

namespace {
// Spin briefly (completions are often microseconds away), then yield for up to a millisecond,
// then sleep with a growing interval so a waiting thread does not eat a core on a small
// machine. The yield phase matters between processes: an MPI transfer (and each step of
// loom's algorithms) advances only while the peers poll, and a yield hands the core to a
// peer at once where a sleep would idle it for up to 200 us per step.
class Backoff {
 public:
  void pause() {
    if (_rounds < 64) {
      ++_rounds;
    } else if (_rounds == 64 || std::chrono::steady_clock::now() < _yield_until) {
      if (_rounds++ == 64)
        _yield_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1);
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(_sleep);
      if (_sleep < std::chrono::microseconds(200)) _sleep *= 2;
    }
  }

 private:
  int _rounds = 0;
  std::chrono::steady_clock::time_point _yield_until;
  std::chrono::microseconds _sleep{1};
};
}  // namespace

void Work::wait() {
  Backoff backoff;
  while (!test()) backoff.pause();
  if (_error) std::rethrow_exception(_error);
}

bool Work::wait_for(std::chrono::nanoseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Backoff backoff;
  while (!test()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    backoff.pause();
  }
  if (_error) std::rethrow_exception(_error);
  return true;
}

}  // namespace loom
