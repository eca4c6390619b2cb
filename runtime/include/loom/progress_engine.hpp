// ProgressEngine: one thread that drives asynchronous Work to completion and reports it.
#pragma once

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "loom/work.hpp"

namespace loom {

/// @brief How the engine's thread is scheduled against the compute threads beside it.
///
/// With every core computing, a progress thread at normal priority waits up to a scheduler
/// slice (milliseconds) each time it wakes to poll, and a transport that moves data only when
/// polled (Open MPI over TCP: rendezvous handshakes, socket reads) then idles the wire: a 1 MiB
/// allreduce on a 2 Gbit/s link took 12-16 ms beside backward against 8.4 ms alone (RESULTS.md,
/// "The progress thread's priority").
enum class ProgressPriority {
  /// realtime where the process may (root, CAP_SYS_NICE or RLIMIT_RTPRIO >= 1), else
  /// short_slice where the kernel has it, else normal; never an error. normal when the host is
  /// oversubscribed (the launcher puts more ranks on it than it has online CPUs): every core
  /// then already runs several ranks, and a progress thread that preempts them makes each step
  /// slower (shared memory, 3-4 ranks on 2 cores: 8-15%, RESULTS.md)
  automatic,
  /// the default policy and slice of the process (SCHED_OTHER)
  normal,
  /// SCHED_OTHER with a 100 us slice (sched_setattr's sched_runtime, Linux 6.12+ EEVDF): the
  /// thread preempts a computing thread sooner when it wakes; needs no privilege
  short_slice,
  /// SCHED_FIFO priority 1: the thread runs as soon as it wakes. Its back-off still sleeps, so
  /// it takes a few percent of a core while work is in flight and none when idle
  realtime,
};

/// @brief "automatic", "normal", "short_slice", "realtime".
std::string_view to_string(ProgressPriority priority) noexcept;

/// @brief The inverse of to_string; anything else is ErrorCode::invalid_argument naming `what`
/// and the values it takes.
ProgressPriority parse_progress_priority(std::string_view text, std::string_view what);

/// @brief LOOM_PROGRESS_PRIORITY; unset: ProgressPriority::automatic.
ProgressPriority progress_priority_from_environment();

/// @brief Polls in-flight Work with back-off and calls a completion callback for each.
///
/// One thread per engine. It spins briefly after activity, then sleeps with a growing interval
/// (up to ~200 us) while work is in flight, and sleeps on a condition variable when there is
/// none, so an idle engine costs no CPU. Callbacks run on the engine thread and must not throw
/// or block.
class ProgressEngine {
 public:
  /// @brief Called once per watched Work: nullptr on success, else the failure (a loom::Error;
  /// ErrorCode::timeout when the deadline passed first).
  using Completion = std::function<void(std::exception_ptr error)>;

  /// @brief Starts the thread and schedules it as `wanted` asks. An explicit request the process
  /// may not have (realtime without the privilege, short_slice on a kernel without custom
  /// slices) is ErrorCode::invalid_argument naming the request and the system's answer;
  /// automatic falls back and says why in priority_note().
  explicit ProgressEngine(ProgressPriority wanted = ProgressPriority::automatic);
  /// @brief Stops the thread. Work still in flight is abandoned (Work::abandon) and dropped
  /// without calling its callback: the destructor never waits for a peer. Failed work is
  /// abandoned before it is destroyed, so its destruction never blocks the engine's thread.
  ~ProgressEngine();
  ProgressEngine(const ProgressEngine&) = delete;
  ProgressEngine& operator=(const ProgressEngine&) = delete;

  /// @brief Watches `work` until it finishes, then calls `on_done`. With a non-zero `timeout`,
  /// a work still running after it is reported as ErrorCode::timeout and then kept (polled,
  /// never reported again) until it finishes or the engine stops, since a started
  /// operation cannot be revoked.
  void watch(std::unique_ptr<Work> work, Completion on_done,
             std::chrono::nanoseconds timeout = std::chrono::nanoseconds::zero());

  /// @brief Works watched and not yet reported.
  std::size_t in_flight() const noexcept;

  /// @brief How the thread is scheduled: normal, short_slice or realtime (never automatic).
  ProgressPriority priority() const noexcept;

  /// @brief What was asked and got, for logs: "realtime (SCHED_FIFO 1)", or "short_slice
  /// (100 us slice; realtime refused: Operation not permitted)".
  const std::string& priority_note() const noexcept;

  /// @brief The thread's kernel id (gettid), for tools that inspect or pin it.
  long thread_id() const noexcept;

 private:
  struct State;
  std::unique_ptr<State> _state;
};

}  // namespace loom
