// ProgressEngine: completions, failures and timeouts are reported once, from its own thread.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <stdexcept>
#include <thread>

#include "loom/error.hpp"
#include "loom/progress_engine.hpp"

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

}  // namespace
}  // namespace loom
