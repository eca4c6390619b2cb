// ProgressEngine: one thread that drives asynchronous Work to completion and reports it.
#pragma once

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <string>

#include "loom/progress_priority.hpp"
#include "loom/work.hpp"

namespace loom {

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
  /// automatic falls back and says why in priority_note(); `compute` is where the compute
  /// beside the thread runs, which automatic weighs when the ranks fill every CPU
  /// (ComputeBeside).
  explicit ProgressEngine(ProgressPriority wanted = ProgressPriority::automatic,
                          ComputeBeside compute = ComputeBeside::outside);
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
