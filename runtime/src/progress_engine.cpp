// ProgressEngine: one thread that drives asynchronous Work to completion and reports it.
#include "loom/progress_engine.hpp"

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "loom/error.hpp"

namespace loom {

namespace {
using Clock = std::chrono::steady_clock;

struct Watched {
  std::unique_ptr<Work> work;
  ProgressEngine::Completion on_done;
  Clock::time_point deadline;
  std::chrono::nanoseconds timeout;
};

std::string seconds_text(std::chrono::nanoseconds timeout) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3g s", std::chrono::duration<double>(timeout).count());
  return text;
}
}  // namespace

struct ProgressEngine::State {
  std::mutex mutex;
  std::condition_variable wake;
  std::vector<Watched> incoming;  // guarded by mutex
  bool stopping = false;          // guarded by mutex
  std::atomic<std::size_t> in_flight{0};
  std::thread thread;

  void loop();
  static void report(Watched& w, std::exception_ptr error) noexcept;
};

void ProgressEngine::State::report(Watched& w, std::exception_ptr error) noexcept {
  try {
    w.on_done(std::move(error));
  } catch (const std::exception& e) {
    // A callback is loom's own code; one that throws is a bug worth seeing, not hiding.
    std::fprintf(stderr, "loom: internal error: a progress callback threw: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "loom: internal error: a progress callback threw\n");
  }
}

void ProgressEngine::State::loop() {
  std::vector<Watched> active, abandoned;
  int idle_rounds = 0;
  auto sleep = std::chrono::microseconds(1);
  for (;;) {
    {
      std::unique_lock lock(mutex);
      if (active.empty() && abandoned.empty())
        wake.wait(lock, [&] { return stopping || !incoming.empty(); });
      if (stopping) {
        // What is still in flight cannot be waited for here (a dead peer would block the
        // engine's destructor forever): abandon it, then let it go.
        for (auto& w : active) w.work->abandon();
        for (auto& w : abandoned) w.work->abandon();
        for (auto& w : incoming) w.work->abandon();  // watched just before the stop
        return;
      }
      for (auto& w : incoming) active.push_back(std::move(w));
      incoming.clear();
    }
    bool progressed = false;
    const auto now = Clock::now();
    for (std::size_t i = 0; i < active.size();) {
      Watched& w = active[i];
      // in_flight drops before the callback runs: whoever the callback wakes must already see
      // the work as reported (in_flight() is "watched and not yet reported").
      if (w.work->test()) {
        in_flight.fetch_sub(1, std::memory_order_acq_rel);
        report(w, w.work->error());
        // A failed work may have left parts in flight (an algorithm's other transfers):
        // destroying it must not wait for them on this thread, which every completion and
        // every timeout needs.
        if (w.work->failed()) w.work->abandon();
        active[i] = std::move(active.back());
        active.pop_back();
        progressed = true;
      } else if (w.timeout.count() > 0 && now >= w.deadline) {
        in_flight.fetch_sub(1, std::memory_order_acq_rel);
        report(w, std::make_exception_ptr(Error(
                      ErrorCode::timeout, w.work->description() + " did not complete within " +
                                              seconds_text(w.timeout))));
        abandoned.push_back(std::move(w));
        active[i] = std::move(active.back());
        active.pop_back();
        progressed = true;
      } else {
        ++i;
      }
    }
    std::erase_if(abandoned, [](Watched& w) {
      if (!w.work->test()) return false;
      if (w.work->failed()) w.work->abandon();
      return true;
    });
    if (progressed) {
      idle_rounds = 0;
      sleep = std::chrono::microseconds(1);
      continue;
    }
    // Back-off: completions often follow within microseconds, so spin a little, then yield,
    // then sleep longer and longer (woken early by new work).
    if (++idle_rounds < 64) continue;
    if (idle_rounds < 128) {
      std::this_thread::yield();
      continue;
    }
    std::unique_lock lock(mutex);
    wake.wait_for(lock, sleep, [&] { return stopping || !incoming.empty(); });
    if (sleep < std::chrono::microseconds(200)) sleep *= 2;
  }
}

ProgressEngine::ProgressEngine() : _state(std::make_unique<State>()) {
  _state->thread = std::thread([state = _state.get()] { state->loop(); });
}

ProgressEngine::~ProgressEngine() {
  {
    std::lock_guard lock(_state->mutex);
    _state->stopping = true;
  }
  _state->wake.notify_all();
  _state->thread.join();
}

void ProgressEngine::watch(std::unique_ptr<Work> work, Completion on_done,
                           std::chrono::nanoseconds timeout) {
  if (!work) throw Error(ErrorCode::invalid_argument, "ProgressEngine::watch: null work");
  _state->in_flight.fetch_add(1, std::memory_order_acq_rel);
  {
    std::lock_guard lock(_state->mutex);
    _state->incoming.push_back(
        {std::move(work), std::move(on_done), Clock::now() + timeout, timeout});
  }
  _state->wake.notify_one();
}

std::size_t ProgressEngine::in_flight() const noexcept {
  return _state->in_flight.load(std::memory_order_acquire);
}

}  // namespace loom
