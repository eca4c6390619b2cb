// ProgressEngine: one thread that drives asynchronous Work to completion and reports it.
#include "loom/progress_engine.hpp"

#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "loom/environment.hpp"
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

// The kernel's struct sched_attr (uapi <linux/sched/types.h>, which clashes with glibc's
// <sched.h>); glibc 2.36 has no sched_setattr wrapper either.
struct SchedAttr {
  std::uint32_t size;
  std::uint32_t sched_policy;
  std::uint64_t sched_flags;
  std::int32_t sched_nice;
  std::uint32_t sched_priority;
  std::uint64_t sched_runtime;
  std::uint64_t sched_deadline;
  std::uint64_t sched_period;
  std::uint32_t sched_util_min;
  std::uint32_t sched_util_max;
};
constexpr std::uint64_t reset_on_fork_flag = 0x01;  // SCHED_FLAG_RESET_ON_FORK
constexpr std::uint64_t short_slice_ns = 100'000;   // the kernel's smallest custom slice

// Threads the engine's thread creates (TBB may start a worker from a completion callback) must
// not inherit its priority: reset-on-fork gives them the default policy and slice.
std::string make_realtime(long tid) {
  sched_param param{};
  param.sched_priority = 1;
  if (sched_setscheduler(static_cast<pid_t>(tid), SCHED_FIFO | SCHED_RESET_ON_FORK, &param) == 0)
    return {};
  return std::strerror(errno);
}

// Only the slice changes: the thread keeps its policy (SCHED_OTHER or SCHED_BATCH) and nice value
// (a process started with nice 10 may not lower it, and one at nice -15 must not be raised).
std::string make_short_slice(long tid) {
  SchedAttr attr{};
  if (syscall(SYS_sched_getattr, tid, &attr, static_cast<unsigned>(sizeof attr), 0U) != 0)
    return std::strerror(errno);
  if (attr.sched_policy != SCHED_OTHER && attr.sched_policy != SCHED_BATCH)
    return "the process runs policy " + std::to_string(attr.sched_policy) +
           ", not SCHED_OTHER or SCHED_BATCH";
  attr.size = sizeof attr;
  attr.sched_flags = reset_on_fork_flag;
  attr.sched_runtime = short_slice_ns;
  if (syscall(SYS_sched_setattr, tid, &attr, 0U) != 0) return std::strerror(errno);
  // Kernels before EEVDF's custom slices (6.12) accept the call and ignore sched_runtime.
  SchedAttr back{};
  if (syscall(SYS_sched_getattr, tid, &back, static_cast<unsigned>(sizeof back), 0U) != 0)
    return std::strerror(errno);
  if (back.sched_runtime != short_slice_ns)
    return "the kernel keeps its own slice (custom slices need Linux 6.12+)";
  return {};
}

// CPUs in this process's affinity mask, or 0 if it cannot be read.
long cpus_allowed() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
  return CPU_COUNT(&set);
}

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
  std::atomic<ProgressPriority> priority{ProgressPriority::normal};
  std::string priority_note = "normal";
  long tid = 0;
  std::thread thread;

  void loop();
  void schedule(ProgressPriority wanted, ComputeBeside compute);
  void stop() noexcept;
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
    // A realtime thread's yield gives the core only to other realtime threads: it would spin.
    if (idle_rounds < 128 &&
        priority.load(std::memory_order_relaxed) != ProgressPriority::realtime) {
      std::this_thread::yield();
      continue;
    }
    std::unique_lock lock(mutex);
    wake.wait_for(lock, sleep, [&] { return stopping || !incoming.empty(); });
    if (sleep < std::chrono::microseconds(200)) sleep *= 2;
  }
}

void ProgressEngine::State::schedule(ProgressPriority wanted, ComputeBeside compute) {
  if (wanted == ProgressPriority::normal) return;
  const long allowed = cpus_allowed();
  std::string refused;
  if (wanted == ProgressPriority::automatic) {
    // The CPUs this process may use (a container's cpuset); a process bound to one CPU says
    // nothing of the host, so then the online count.
    const long cpus = allowed > 1 ? allowed : sysconf(_SC_NPROCESSORS_ONLN);
    // More ranks than CPUs: every core already runs several ranks. As many: each rank's
    // compute fills a core, and a realtime thread that wakes to poll preempts it every time;
    // that pays where loom's workers compute (ComputeBeside::loom_workers), not beside an
    // autograd engine (ComputeBeside::outside; the figures are at ComputeBeside).
    if (const auto ranks = environment::launcher_local_size();
        ranks && cpus > 0 &&
        (*ranks > cpus || (*ranks == cpus && compute == ComputeBeside::outside))) {
      priority_note = "normal (automatic: " + std::to_string(*ranks) + " ranks on this host's " +
                      std::to_string(cpus) + " CPUs" +
                      (*ranks == cpus ? ", the compute outside loom's workers)" : ")");
      return;
    }
    // Bound to one CPU (mpirun's default --bind-to core at 2 ranks), the compute threads cannot
    // move away from a realtime thread that waits on a lock one of them holds (TBB's spin
    // locks, from a completion): only the kernel's realtime throttling would end the wait.
    if (allowed == 1) refused = "realtime not tried: the process is bound to one CPU";
  }
  if (wanted == ProgressPriority::realtime ||
      (wanted == ProgressPriority::automatic && refused.empty())) {
    const std::string why = make_realtime(tid);
    if (why.empty()) {
      priority = ProgressPriority::realtime;
      priority_note = "realtime (SCHED_FIFO 1)";
      return;
    }
    if (wanted == ProgressPriority::realtime)
      throw Error(ErrorCode::invalid_argument,
                  "progress thread priority 'realtime' (SCHED_FIFO) refused: " + why +
                      " (needs root, CAP_SYS_NICE or RLIMIT_RTPRIO >= 1; 'automatic' falls back)");
    refused = "realtime refused: " + why;
  }
  const std::string why = make_short_slice(tid);
  if (why.empty()) {
    priority = ProgressPriority::short_slice;
    priority_note = "short_slice (100 us slice" + (refused.empty() ? "" : "; " + refused) + ")";
    return;
  }
  if (wanted == ProgressPriority::short_slice)
    throw Error(ErrorCode::invalid_argument,
                "progress thread priority 'short_slice' (100 us sched_runtime) refused: " + why +
                    " ('automatic' falls back)");
  priority_note = "normal (" + refused + "; short_slice refused: " + why + ")";
}

void ProgressEngine::State::stop() noexcept {
  {
    std::lock_guard lock(mutex);
    stopping = true;
  }
  wake.notify_all();
  thread.join();
}

std::string_view to_string(ProgressPriority priority) noexcept {
  switch (priority) {
    case ProgressPriority::automatic:
      return "automatic";
    case ProgressPriority::normal:
      return "normal";
    case ProgressPriority::short_slice:
      return "short_slice";
    case ProgressPriority::realtime:
      return "realtime";
  }
  return "?";
}

ProgressPriority parse_progress_priority(std::string_view text, std::string_view what) {
  for (ProgressPriority p : {ProgressPriority::automatic, ProgressPriority::normal,
                             ProgressPriority::short_slice, ProgressPriority::realtime})
    if (text == to_string(p)) return p;
  throw Error(ErrorCode::invalid_argument,
              std::string(what) + "='" + std::string(text) +
                  "' is not a progress thread priority (automatic, normal, short_slice, realtime)");
}

ProgressPriority progress_priority_from_environment() {
  const auto text = environment::text("LOOM_PROGRESS_PRIORITY");
  return text ? parse_progress_priority(*text, "LOOM_PROGRESS_PRIORITY")
              : ProgressPriority::automatic;
}

ProgressEngine::ProgressEngine(ProgressPriority wanted, ComputeBeside compute)
    : _state(std::make_unique<State>()) {
  std::promise<long> started;
  std::future<long> tid = started.get_future();
  _state->thread = std::thread([state = _state.get(), &started] {
    // Named for top -H, perf and debuggers (15 characters at most).
    pthread_setname_np(pthread_self(), "loom-progress");
    started.set_value(static_cast<long>(gettid()));
    state->loop();
  });
  _state->tid = tid.get();
  try {
    _state->schedule(wanted, compute);
  } catch (...) {
    _state->stop();
    throw;
  }
}

ProgressEngine::~ProgressEngine() {
  _state->stop();
}

ProgressPriority ProgressEngine::priority() const noexcept {
  return _state->priority.load();
}

const std::string& ProgressEngine::priority_note() const noexcept {
  return _state->priority_note;
}

long ProgressEngine::thread_id() const noexcept {
  return _state->tid;
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
