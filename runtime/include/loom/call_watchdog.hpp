// CallWatchdog: watches blocking transport calls that cannot be abandoned (a blocking
// MPI_Allreduce): a monitor thread sees a call still inside after the timeout and runs the
// expiry action, which reports and ends the process, as PyTorch's NCCL watchdog does.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

namespace loom {

/// @brief The status a process ends with when loom ends it: a blocking call did not return
/// within the timeout, or operations were abandoned and MPI could not be finalised.
inline constexpr int fatal_exit_status = 124;

/// @brief One watched call at a time (a rank's blocking calls are sequential).
///
/// enter()/leave() are four relaxed stores (and two relaxed loads), so they cost nothing next
/// to the call they bracket; the monitor thread starts on the first enter() with a timeout and
/// samples every timeout / 20 (at most 100 ms): a call is overdue once the same call (each
/// enter() is a new one, whatever its token) has been inside for the timeout.
class CallWatchdog {
 public:
  /// @brief Called on the monitor thread with the overdue call's token; expected not to
  /// return (it reports, dumps and ends the process); if it does, the call is not reported again.
  using Expiry = std::function<void(std::uint64_t token)>;

  CallWatchdog() = default;
  ~CallWatchdog();
  CallWatchdog(const CallWatchdog&) = delete;
  CallWatchdog& operator=(const CallWatchdog&) = delete;

  /// @brief 0 disables. Set before the first enter().
  void set_timeout(std::chrono::nanoseconds timeout) noexcept { _timeout = timeout; }
  std::chrono::nanoseconds timeout() const noexcept { return _timeout; }
  void on_expiry(Expiry expiry) { _expiry = std::move(expiry); }

  /// @brief Throws Error(unavailable) if the monitor thread cannot start (the system refuses a
  /// thread): loom makes no blocking call it could not end at the timeout. Tried again on the
  /// next enter().
  void enter(std::uint64_t token) {
    if (!_started.load(std::memory_order_relaxed)) start();
    // Each call its own number, so that a loop of calls with one token (repeated blocking
    // calls share a flight-record entry) is never one long call to the monitor.
    const std::uint64_t call = _calls.load(std::memory_order_relaxed) + 1;
    _calls.store(call, std::memory_order_relaxed);
    _token.store(token, std::memory_order_relaxed);
    _inside.store(call, std::memory_order_relaxed);
  }
  void leave() noexcept { _inside.store(0, std::memory_order_relaxed); }

 private:
  void start();
  void monitor();

  std::chrono::nanoseconds _timeout{0};
  Expiry _expiry;
  std::atomic<std::uint64_t> _inside{0};  // the number of the call inside (from 1), or 0
  std::atomic<std::uint64_t> _calls{0};   // calls entered so far
  std::atomic<std::uint64_t> _token{0};   // the token of the call inside
  std::atomic<bool> _started{false};
  std::mutex _mutex;
  std::condition_variable _wake;
  bool _stopping = false;  // guarded by _mutex
  std::thread _thread;
};

/// @brief Brackets one watched call: enter() on construction, leave() on destruction.
class WatchedCall {
 public:
  /// @brief Throws what CallWatchdog::enter() throws, before the call is made.
  WatchedCall(CallWatchdog& watchdog, std::uint64_t token) : _watchdog(watchdog) {
    _watchdog.enter(token);
  }
  ~WatchedCall() { _watchdog.leave(); }
  WatchedCall(const WatchedCall&) = delete;
  WatchedCall& operator=(const WatchedCall&) = delete;

 private:
  CallWatchdog& _watchdog;
};

}  // namespace loom
