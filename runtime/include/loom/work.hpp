// Work: the handle of an asynchronous operation (test, wait, wait_for, error).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>

namespace loom {

/// @brief Handle of an operation started asynchronously by a Backend.
///
/// test() advances and polls the operation; wait() blocks with back-off until it ends and
/// rethrows its failure as loom::Error. Any thread may call these; calls are serialised.
class Work {
 public:
  explicit Work(std::string description);
  virtual ~Work();
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  /// @brief Advances the operation; true once it has finished (successfully or not). Never throws.
  bool test() noexcept;
  /// @brief Blocks until finished; throws the operation's loom::Error if it failed.
  void wait();
  /// @brief Waits at most `timeout`: true when finished successfully, false when still running;
  /// throws the operation's loom::Error if it failed.
  bool wait_for(std::chrono::nanoseconds timeout);

  bool finished() const noexcept { return _finished.load(std::memory_order_acquire); }
  bool failed() const noexcept { return finished() && _error != nullptr; }
  /// @brief The failure, or nullptr; meaningful once finished().
  std::exception_ptr error() const noexcept { return finished() ? _error : nullptr; }
  /// @brief What this operation is ("allreduce float32[1024] sum on rank 0"); built on first
  /// use for handles made with the lazy constructor.
  const std::string& description() const noexcept;

  /// @brief Gives up on the operation: its destructor will not wait for it (nor for anything
  /// it started), and what it holds of the transport is left behind (counted by
  /// abandoned_operations()). For operations a failure or a timeout left unfinishable: the
  /// process should end soon after, since the transport may still write into the buffers.
  void abandon() noexcept;
  bool abandoned() const noexcept { return _abandoned.load(std::memory_order_acquire); }

 protected:
  /// @brief For handles on a hot path: the description is made by describe() when first asked
  /// for (an error, a tool), so issuing the operation builds no strings.
  Work() = default;
  /// @brief The description of a handle made with Work(); called at most once.
  virtual std::string describe() const { return {}; }

  /// @brief Advances the operation; true when it has finished. Throwing marks it failed.
  /// Called with the work's lock held, never after it returned true.
  virtual bool poll() = 0;

  /// @brief Called once by abandon(): a work made of other works abandons them here.
  virtual void on_abandon() noexcept {}

 private:
  mutable std::once_flag _described;
  mutable std::string _description;
  std::mutex _mutex;
  std::atomic<bool> _finished{false};
  std::atomic<bool> _abandoned{false};
  std::exception_ptr _error;
};

/// @brief Transport operations this process left unfinished (abandoned works that were still
/// in flight). Once non-zero, loom does not finalise MPI (it would wait for them) and ends the
/// process with fatal_exit_status at exit (see loom/call_watchdog.hpp).
std::uint64_t abandoned_operations() noexcept;
/// @brief Counts one abandoned transport operation (for backends' works).
void note_abandoned_operation() noexcept;

/// @brief A Work that finished when it was made (an eager send, an empty collective).
class CompletedWork final : public Work {
 public:
  explicit CompletedWork(std::string description) : Work(std::move(description)) {}

 protected:
  bool poll() override { return true; }
};

}  // namespace loom
