// ProgressEngine: completions, failures and timeouts are reported once, from its own thread.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include "loom/error.hpp"
#include "loom/progress_engine.hpp"
#include "scoped_env.hpp"

namespace loom {
namespace {

using namespace std::chrono_literals;

// Finishes once `release` is set; fails instead when `fail` is set.
class FlagWork final : public Work {
 public:
  FlagWork(std::atomic<bool>& release, bool fail = false)
      : Work("flag work"), _release(release), _fail(fail) {}

 protected:
  bool poll() override {
    if (!_release.load()) return false;
    if (_fail) throw Error(ErrorCode::backend_failure, "flag work failed");
    return true;
  }

 private:
  std::atomic<bool>& _release;
  bool _fail;
};

TEST(ProgressEngine, ReportsCompletionOnItsOwnThread) {
  ProgressEngine engine;
  std::atomic<bool> release{false};
  std::promise<std::thread::id> reported;
  engine.watch(std::make_unique<FlagWork>(release), [&](std::exception_ptr error) {
    EXPECT_EQ(error, nullptr);
    reported.set_value(std::this_thread::get_id());
  });
  EXPECT_EQ(engine.in_flight(), 1u);
  std::this_thread::sleep_for(5ms);  // let the engine back off to sleeping
  release = true;
  auto future = reported.get_future();
  ASSERT_EQ(future.wait_for(5s), std::future_status::ready);
  EXPECT_NE(future.get(), std::this_thread::get_id());
  EXPECT_EQ(engine.in_flight(), 0u);
}

// The thread is named, so that top -H, perf and debuggers show which thread it is.
TEST(ProgressEngine, ThreadIsNamedLoomProgress) {
  ProgressEngine engine(ProgressPriority::normal);
  std::ifstream comm("/proc/self/task/" + std::to_string(engine.thread_id()) + "/comm");
  std::string name;
  std::getline(comm, name);
  EXPECT_EQ(name, "loom-progress");
}

TEST(ProgressEngine, ReportsFailures) {
  ProgressEngine engine;
  std::atomic<bool> release{true};
  std::promise<std::string> reported;
  engine.watch(std::make_unique<FlagWork>(release, true), [&](std::exception_ptr error) {
    try {
      std::rethrow_exception(error);
    } catch (const Error& e) {
      reported.set_value(e.message());
    }
  });
  auto future = reported.get_future();
  ASSERT_EQ(future.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(future.get(), "flag work failed");
}

TEST(ProgressEngine, TimesOutOnceAndKeepsTheWorkAlive) {
  ProgressEngine engine;
  std::atomic<bool> release{false};
  std::atomic<int> calls{0};
  std::promise<ErrorCode> reported;
  engine.watch(
      std::make_unique<FlagWork>(release),
      [&](std::exception_ptr error) {
        ++calls;
        try {
          std::rethrow_exception(error);
        } catch (const Error& e) {
          reported.set_value(e.code());
        }
      },
      20ms);
  auto future = reported.get_future();
  ASSERT_EQ(future.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(future.get(), ErrorCode::timeout);
  release = true;  // finishing late is not reported again
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(calls.load(), 1);
}

TEST(ProgressEngine, ManyWorksFromManyThreads) {
  ProgressEngine engine;
  std::atomic<bool> release{true};
  std::atomic<int> done{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int k = 0; k < 250; ++k)
        engine.watch(std::make_unique<FlagWork>(release), [&](std::exception_ptr) { ++done; });
    });
  for (auto& t : threads) t.join();
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (done.load() < 1000 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  EXPECT_EQ(done.load(), 1000);
}

// A transfer stuck on a peer that never comes: its destructor would wait for it (as an MPI
// request's does) unless it was abandoned; waiting is bounded here so a regression fails the
// test instead of hanging it.
class StuckWork final : public Work {
 public:
  explicit StuckWork(bool fails, std::atomic<int>& blocked)
      : Work("stuck"), _fails(fails), _blocked(blocked) {}
  ~StuckWork() override {
    if (abandoned()) return;
    ++_blocked;
    std::this_thread::sleep_for(std::chrono::seconds(3));
  }

 protected:
  bool poll() override {
    if (_fails) throw Error(ErrorCode::backend_failure, "one transfer of the algorithm failed");
    return false;
  }

 private:
  bool _fails;
  std::atomic<int>& _blocked;
};

// Issue 12, item 3: failed work is abandoned before it is destroyed on the engine's thread, so
// the next completion is not held up; the engine's destructor abandons what is still in flight
// (a timed-out work included) and returns at once.
TEST(ProgressEngine, FailedAndUnfinishedWorkIsAbandonedNeverWaitedFor) {
  std::atomic<int> blocked{0};
  const auto start = std::chrono::steady_clock::now();
  {
    ProgressEngine engine;
    std::promise<std::exception_ptr> failed;
    engine.watch(std::make_unique<StuckWork>(true, blocked),
                 [&](std::exception_ptr e) { failed.set_value(e); });
    EXPECT_NE(failed.get_future().get(), nullptr);
    std::promise<void> next;
    engine.watch(std::make_unique<CompletedWork>("next"),
                 [&](std::exception_ptr) { next.set_value(); });
    EXPECT_EQ(next.get_future().wait_for(std::chrono::seconds(1)), std::future_status::ready);
    std::promise<std::exception_ptr> timed_out;
    engine.watch(
        std::make_unique<StuckWork>(false, blocked),
        [&](std::exception_ptr e) { timed_out.set_value(e); }, std::chrono::milliseconds(50));
    EXPECT_NE(timed_out.get_future().get(), nullptr);
    engine.watch(std::make_unique<StuckWork>(false, blocked), [](std::exception_ptr) {});
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(blocked.load(), 0);
  EXPECT_LT(seconds, 1.0);
}

using test::ScopedEnv;

// The launcher's local rank count, which automatic reads, unset for a test.
struct NoLauncher {
  ScopedEnv open_mpi{"OMPI_COMM_WORLD_LOCAL_SIZE", nullptr};
  ScopedEnv hydra{"MPI_LOCALNRANKS", nullptr};
  ScopedEnv torch{"LOCAL_WORLD_SIZE", nullptr};
};

// The scheduling policy of thread `tid` without the reset-on-fork bit.
int policy_of(long tid) {
  return sched_getscheduler(static_cast<pid_t>(tid)) & ~SCHED_RESET_ON_FORK;
}

// The kernel's sched_runtime of thread `tid` (its EEVDF slice for SCHED_OTHER on 6.12+).
std::uint64_t slice_of(long tid) {
  struct {
    std::uint32_t size, policy;
    std::uint64_t flags;
    std::int32_t nice;
    std::uint32_t priority;
    std::uint64_t runtime, deadline, period;
    std::uint32_t util_min, util_max;
  } attr{};
  if (syscall(SYS_sched_getattr, tid, &attr, static_cast<unsigned>(sizeof attr), 0U) != 0) return 0;
  return attr.runtime;
}

// Runs one work to completion on `engine`: the priority must not change what the engine does.
void completes_one(ProgressEngine& engine) {
  std::atomic<bool> release{false};
  std::promise<void> reported;
  engine.watch(std::make_unique<FlagWork>(release), [&](std::exception_ptr error) {
    EXPECT_EQ(error, nullptr);
    reported.set_value();
  });
  std::this_thread::sleep_for(2ms);
  release = true;
  EXPECT_EQ(reported.get_future().wait_for(5s), std::future_status::ready);
}

TEST(ProgressPriority, NamesParseBothWaysAndABadOneIsNamed) {
  for (ProgressPriority p : {ProgressPriority::automatic, ProgressPriority::normal,
                             ProgressPriority::short_slice, ProgressPriority::realtime})
    EXPECT_EQ(parse_progress_priority(to_string(p), "test"), p);
  try {
    (void)parse_progress_priority("high", "LOOM_PROGRESS_PRIORITY");
    ADD_FAILURE() << "accepted 'high'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(e.message().find("LOOM_PROGRESS_PRIORITY='high'"), std::string::npos) << e.what();
    EXPECT_NE(e.message().find("short_slice"), std::string::npos) << e.what();
  }
}

// The tests compare against the default policy: a runner started under chrt -b/-i is skipped.
#define SKIP_UNLESS_RUNNER_IS_SCHED_OTHER() \
  if (policy_of(gettid()) != SCHED_OTHER)   \
  GTEST_SKIP() << "the test runner's policy is " << policy_of(gettid()) << ", not SCHED_OTHER"

TEST(ProgressPriority, NormalKeepsTheDefaultPolicy) {
  SKIP_UNLESS_RUNNER_IS_SCHED_OTHER();
  ProgressEngine engine(ProgressPriority::normal);
  EXPECT_EQ(engine.priority(), ProgressPriority::normal);
  EXPECT_EQ(engine.priority_note(), "normal");
  EXPECT_EQ(policy_of(engine.thread_id()), SCHED_OTHER);
  completes_one(engine);
}

// automatic takes the best the process may have, and the thread really is scheduled so.
TEST(ProgressPriority, AutomaticTakesWhatTheProcessMayAndTheKernelShowsIt) {
  SKIP_UNLESS_RUNNER_IS_SCHED_OTHER();
  NoLauncher no_launcher;
  ProgressEngine engine;
  const long tid = engine.thread_id();
  EXPECT_NE(tid, static_cast<long>(gettid()));
  switch (engine.priority()) {
    case ProgressPriority::realtime: {
      EXPECT_EQ(policy_of(tid), SCHED_FIFO);
      sched_param param{};
      ASSERT_EQ(sched_getparam(static_cast<pid_t>(tid), &param), 0);
      EXPECT_EQ(param.sched_priority, 1);
      EXPECT_EQ(engine.priority_note(), "realtime (SCHED_FIFO 1)");
      break;
    }
    case ProgressPriority::short_slice:
      EXPECT_EQ(policy_of(tid), SCHED_OTHER);
      EXPECT_EQ(slice_of(tid), 100'000u);
      EXPECT_NE(engine.priority_note().find("realtime"), std::string::npos);
      break;
    case ProgressPriority::normal:
      EXPECT_EQ(policy_of(tid), SCHED_OTHER);
      EXPECT_NE(engine.priority_note().find("short_slice refused"), std::string::npos);
      break;
    case ProgressPriority::automatic:
      ADD_FAILURE() << "priority() is never automatic";
      break;
  }
  // The calling thread is untouched.
  EXPECT_EQ(policy_of(gettid()), SCHED_OTHER);
  completes_one(engine);
}

// More ranks on the host than CPUs (as the launcher says): automatic stays normal; as many, it
// stays normal beside compute outside loom's workers and asks for more beside loom's workers.
TEST(ProgressPriority, AutomaticStaysNormalOnAnOversubscribedHost) {
  SKIP_UNLESS_RUNNER_IS_SCHED_OTHER();
  NoLauncher no_launcher;
  cpu_set_t set;
  ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  const long cpus = CPU_COUNT(&set) > 1 ? CPU_COUNT(&set) : sysconf(_SC_NPROCESSORS_ONLN);
  ASSERT_GT(cpus, 0);
  {
    ScopedEnv ranks("OMPI_COMM_WORLD_LOCAL_SIZE", std::to_string(cpus + 1).c_str());
    ProgressEngine engine;
    EXPECT_EQ(engine.priority(), ProgressPriority::normal);
    EXPECT_EQ(engine.priority_note(), "normal (automatic: " + std::to_string(cpus + 1) +
                                          " ranks on this host's " + std::to_string(cpus) +
                                          " CPUs)");
    EXPECT_EQ(policy_of(engine.thread_id()), SCHED_OTHER);
    completes_one(engine);
  }
  // As many ranks as CPUs, the compute outside loom (the default: an autograd engine): normal.
  {
    ScopedEnv ranks("OMPI_COMM_WORLD_LOCAL_SIZE", std::to_string(cpus).c_str());
    ProgressEngine engine;
    EXPECT_EQ(engine.priority(), ProgressPriority::normal);
    EXPECT_EQ(engine.priority_note(), "normal (automatic: " + std::to_string(cpus) +
                                          " ranks on this host's " + std::to_string(cpus) +
                                          " CPUs, the compute outside loom's workers)");
  }
  // As many ranks as CPUs with loom's workers computing: more than normal.
  {
    ScopedEnv ranks("OMPI_COMM_WORLD_LOCAL_SIZE", std::to_string(cpus).c_str());
    ProgressEngine engine(ProgressPriority::automatic, ComputeBeside::loom_workers);
    EXPECT_EQ(engine.priority_note().find("automatic:"), std::string::npos)
        << engine.priority_note();
    completes_one(engine);
  }
  // More ranks than CPUs stays normal whatever computes.
  {
    ScopedEnv ranks("OMPI_COMM_WORLD_LOCAL_SIZE", std::to_string(cpus + 1).c_str());
    ProgressEngine engine(ProgressPriority::automatic, ComputeBeside::loom_workers);
    EXPECT_EQ(engine.priority(), ProgressPriority::normal);
  }
  // A CPU to spare beside the ranks: automatic asks for more than normal.
  if (cpus > 1) {
    ScopedEnv ranks("OMPI_COMM_WORLD_LOCAL_SIZE", std::to_string(cpus - 1).c_str());
    ProgressEngine engine;
    EXPECT_EQ(engine.priority_note().find("automatic:"), std::string::npos)
        << engine.priority_note();
  }
}

// Bound to one CPU, automatic never takes realtime (its compute threads could not move away
// from it).
TEST(ProgressPriority, AutomaticTakesNoRealtimeOnOneCpu) {
  SKIP_UNLESS_RUNNER_IS_SCHED_OTHER();
  NoLauncher no_launcher;
  std::string note;
  ProgressPriority got = ProgressPriority::automatic;
  int policy = -1;
  std::thread bound([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu(), &one);
    if (sched_setaffinity(0, sizeof one, &one) != 0) return;
    ProgressEngine engine;  // constructed, and its thread started, on the one CPU
    got = engine.priority();
    note = engine.priority_note();
    policy = policy_of(engine.thread_id());
    completes_one(engine);
  });
  bound.join();
  EXPECT_NE(got, ProgressPriority::automatic) << "sched_setaffinity failed";
  EXPECT_NE(got, ProgressPriority::realtime);
  EXPECT_NE(policy, SCHED_FIFO);
  EXPECT_NE(note.find("realtime not tried: the process is bound to one CPU"), std::string::npos)
      << note;
}

// short_slice changes the slice only: a niced process's progress thread keeps its nice value
// (and needs no privilege to keep it).
TEST(ProgressPriority, ShortSliceKeepsTheNiceValue) {
  SKIP_UNLESS_RUNNER_IS_SCHED_OTHER();
  int nice_seen = -100;
  std::uint64_t slice = 0;
  std::string error;
  std::thread niced([&] {
    if (setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 5) != 0) return;
    try {
      ProgressEngine engine(ProgressPriority::short_slice);
      nice_seen = getpriority(PRIO_PROCESS, static_cast<id_t>(engine.thread_id()));
      slice = slice_of(engine.thread_id());
    } catch (const Error& e) {
      error = e.what();
    }
  });
  niced.join();
  if (error.find("custom slices need Linux 6.12+") != std::string::npos)
    GTEST_SKIP() << "this kernel has no custom slices: " << error;
  ASSERT_TRUE(error.empty()) << error;
  EXPECT_EQ(nice_seen, 5);
  EXPECT_EQ(slice, 100'000u);
}

// A thread started from a completion (TBB may start a worker there) must not inherit realtime.
TEST(ProgressPriority, ThreadsStartedByTheEngineDoNotInheritRealtime) {
  std::unique_ptr<ProgressEngine> engine;
  try {
    engine = std::make_unique<ProgressEngine>(ProgressPriority::realtime);
  } catch (const Error& e) {
    GTEST_SKIP() << "this process may not use SCHED_FIFO: " << e.what();
  }
  std::atomic<bool> release{true};
  std::promise<int> child_policy;
  engine->watch(std::make_unique<FlagWork>(release), [&](std::exception_ptr) {
    EXPECT_EQ(policy_of(gettid()), SCHED_FIFO);  // the engine's own thread
    std::thread child([&] { child_policy.set_value(policy_of(gettid())); });
    child.join();
  });
  auto future = child_policy.get_future();
  ASSERT_EQ(future.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(future.get(), SCHED_OTHER);
}

// Without the privilege (a real unprivileged process: root drops to nobody in a child), an
// explicit realtime request is an error naming the refusal, and automatic falls back.
[[noreturn]] void try_realtime_unprivileged() {
  NoLauncher no_launcher;
  if (geteuid() == 0 && setresuid(65534, 65534, 65534) != 0) std::_Exit(3);
  rlimit none{0, 0};
  if (setrlimit(RLIMIT_RTPRIO, &none) != 0) std::_Exit(4);
  try {
    ProgressEngine refused(ProgressPriority::realtime);
    std::fprintf(stderr, "realtime was granted\n");
    std::_Exit(5);
  } catch (const Error& e) {
    const bool named = e.code() == ErrorCode::invalid_argument &&
                       e.message().find("'realtime' (SCHED_FIFO) refused") != std::string::npos &&
                       e.message().find("CAP_SYS_NICE") != std::string::npos;
    if (!named) {
      std::fprintf(stderr, "wrong error: %s\n", e.what());
      std::_Exit(6);
    }
  }
  ProgressEngine fallback;
  if (fallback.priority() == ProgressPriority::realtime ||
      fallback.priority_note().find("realtime refused") == std::string::npos ||
      policy_of(fallback.thread_id()) != SCHED_OTHER) {
    std::fprintf(stderr, "fallback: %s\n", fallback.priority_note().c_str());
    std::_Exit(7);
  }
  completes_one(fallback);
  std::fprintf(stderr, "refused and fell back to %s\n", fallback.priority_note().c_str());
  std::_Exit(0);
}

// Whether uid `uid` exists in this user namespace (a rootless container maps a few ids only).
bool uid_mapped(unsigned uid) {
  std::ifstream map("/proc/self/uid_map");
  for (unsigned inside, outside, count; map >> inside >> outside >> count;)
    if (uid >= inside && uid - inside < count) return true;
  return false;
}

TEST(ProgressPriority, RealtimeWithoutPrivilegeIsAnErrorAndAutomaticFallsBack) {
  if (geteuid() == 0 && !uid_mapped(65534))
    GTEST_SKIP() << "uid 65534 is not mapped in this user namespace: root cannot drop to it";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(try_realtime_unprivileged(), ::testing::ExitedWithCode(0),
              "refused and fell back to");
}

}  // namespace
}  // namespace loom
