// CallWatchdog: the monitor thread.
#include "loom/call_watchdog.hpp"

#include <algorithm>
#include <string>
#include <system_error>

#include "loom/error.hpp"

namespace loom {

CallWatchdog::~CallWatchdog() {
  {
    std::lock_guard lock(_mutex);
    _stopping = true;
  }
  _wake.notify_all();
  if (_thread.joinable()) _thread.join();
}

void CallWatchdog::start() {
  if (_timeout.count() <= 0 || !_expiry) return;
  std::lock_guard lock(_mutex);
  if (_started.load(std::memory_order_relaxed)) return;
  try {
    _thread = std::thread([this] { monitor(); });
  } catch (const std::system_error& e) {
    // Unwatched, a blocking call to a stopped peer would never return: refuse it instead.
    throw Error(ErrorCode::unavailable,
                std::string("the call watchdog could not start its monitor thread (") + e.what() +
                    "): loom makes no blocking transport call it could not end after the "
                    "timeout (LOOM_TIMEOUT_S)");
  }
  _started.store(true, std::memory_order_relaxed);
}

void CallWatchdog::monitor() {
  using Clock = std::chrono::steady_clock;
  const auto period = std::clamp<std::chrono::nanoseconds>(
      _timeout / 20, std::chrono::milliseconds(1), std::chrono::milliseconds(100));
  std::uint64_t seen = 0;
  Clock::time_point since{};
  bool reported = false;
  std::unique_lock lock(_mutex);
  while (!_wake.wait_for(lock, period, [&] { return _stopping; })) {
    const std::uint64_t inside = _inside.load(std::memory_order_relaxed);
    const auto now = Clock::now();
    if (inside == 0 || inside != seen) {
      seen = inside;
      since = now;
      reported = false;
      continue;
    }
    if (!reported && now - since >= _timeout) {
      reported = true;
      lock.unlock();
      _expiry(_token.load(std::memory_order_relaxed));
      lock.lock();
    }
  }
}

}  // namespace loom
