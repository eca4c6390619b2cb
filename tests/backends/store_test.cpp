// FileStore and Rendezvous: the store's operations, a rendezvous of threads and of real
// processes (fork), and every way it fails: a store that cannot be reached, a rank that never
// arrives, a rank killed before a barrier, mismatched world sizes, the same group made twice.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "expect_error.hpp"
#include "loom/error.hpp"
#include "loom/store.hpp"
#include "scoped_env.hpp"

namespace loom {
namespace {

using namespace std::chrono_literals;
using test::expect_error;
using test::ScopedEnv;

// A fresh directory per test, removed afterwards.
class StoreDir {
 public:
  StoreDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path = (std::filesystem::temp_directory_path() /
            ("loom_store_" + std::to_string(::getpid()) + "_" + info->name()))
               .string();
    std::filesystem::remove_all(path);
  }
  ~StoreDir() { std::filesystem::remove_all(path); }
  std::string path;
};

std::vector<std::byte> bytes(const std::string& text) {
  std::vector<std::byte> out(text.size());
  if (!text.empty()) std::memcpy(out.data(), text.data(), text.size());
  return out;
}

std::string text(const std::vector<std::byte>& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

TEST(FileStore, SetGetAndAdd) {
  StoreDir dir;
  FileStore store(dir.path + "/nested/deeper");  // parents are created
  EXPECT_FALSE(store.try_get("a/b").has_value());
  store.set("a/b", bytes("first"));
  store.set("a/b", bytes("second value"));  // replaced whole
  EXPECT_EQ(text(*store.try_get("a/b")), "second value");
  store.set("odd key %/\n\x01", bytes(""));
  ASSERT_TRUE(store.try_get("odd key %/\n\x01").has_value());
  EXPECT_TRUE(store.try_get("odd key %/\n\x01")->empty());
  EXPECT_FALSE(store.try_get("odd key").has_value());  // keys are not prefixes of each other
  EXPECT_EQ(store.add("counter", 5), 5);
  EXPECT_EQ(store.add("counter", -2), 3);
  store.set("text", bytes("abc"));
  expect_error(ErrorCode::invalid_argument, "key 'text' holds 'abc', not an integer",
               [&] { store.add("text", 1); });
}

TEST(FileStore, AddIsAtomicAcrossThreads) {
  StoreDir dir;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      FileStore store(dir.path);  // each its own handle on the directory, as processes have
      for (int i = 0; i < 50; ++i) store.add("n", 1);
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(FileStore(dir.path).add("n", 0), 200);
}

TEST(FileStore, WaitReturnsWhatIsStillMissing) {
  StoreDir dir;
  FileStore store(dir.path);
  store.set("here", bytes("x"));
  const std::vector<std::string> keys{"here", "absent"};
  const auto start = Store::Clock::now();
  EXPECT_EQ(store.wait(keys, start + 50ms), std::vector<std::string>{"absent"});
  EXPECT_GE(Store::Clock::now() - start, 50ms);
  std::thread later([&] {
    std::this_thread::sleep_for(30ms);
    FileStore(dir.path).set("absent", bytes("y"));
  });
  EXPECT_TRUE(store.wait(keys, Store::Clock::now() + 10s).empty());
  later.join();
}

TEST(FileStore, AnUnreachableStoreIsNamed) {
  StoreDir dir;
  std::filesystem::create_directories(dir.path);
  std::ofstream(dir.path + "/file") << "not a directory";
  expect_error(ErrorCode::unavailable, "file store " + dir.path + "/file/sub: cannot create",
               [&] { FileStore(dir.path + "/file/sub"); });
  expect_error(ErrorCode::unavailable, "is not a directory",
               [&] { FileStore(dir.path + "/file"); });
  expect_error(ErrorCode::unavailable, "cannot create /proc/loom_no_such",
               [] { FileStore("/proc/loom_no_such/store"); });
}

// Every rank a thread with its own Rendezvous on one directory.
template <class Body>
void ranks_as_threads(const std::string& dir, int world, Body body,
                      std::chrono::nanoseconds timeout = 10s, std::string group = "world") {
  std::vector<std::thread> threads;
  std::vector<std::string> failures(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        Rendezvous rv(std::make_shared<FileStore>(dir), r, world, group, timeout);
        body(rv);
      } catch (const std::exception& e) {
        failures[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(failures[static_cast<std::size_t>(r)], "") << r;
}

TEST(Rendezvous, BroadcastAllgatherBarrierAndTopologyAt1To5Ranks) {
  for (int world = 1; world <= 5; ++world) {
    StoreDir dir;
    ranks_as_threads(dir.path, world, [world](Rendezvous& rv) {
      const int me = rv.rank();
      EXPECT_EQ(rv.world_size(), world);
      EXPECT_EQ(rv.instance(), 0);
      for (int root = 0; root < world; ++root) {
        const auto got = rv.broadcast(bytes("from " + std::to_string(me)), root);
        EXPECT_EQ(text(got), "from " + std::to_string(root));
      }
      const auto all = rv.allgather(bytes(std::string(static_cast<std::size_t>(me) * 3, 'x')));
      ASSERT_EQ(all.size(), static_cast<std::size_t>(world));
      for (int r = 0; r < world; ++r)
        EXPECT_EQ(text(all[static_cast<std::size_t>(r)]),
                  std::string(static_cast<std::size_t>(r) * 3, 'x'));
      rv.barrier();
      EXPECT_EQ(rv.topology().world_size(), world);
      EXPECT_EQ(rv.topology().node_count(), 1);  // threads of one host
      char host[256] = {};
      ::gethostname(host, sizeof host - 1);
      EXPECT_EQ(rv.host_of(me), host);
      EXPECT_EQ(rv.topology().node_name(0), host);
    });
  }
}

TEST(Rendezvous, TheSameGroupMadeTwiceKeepsItsInstancesApart) {
  StoreDir dir;
  const int world = 3;
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      auto store = std::make_shared<FileStore>(dir.path);
      Rendezvous first(store, r, world, "g", 10s);
      Rendezvous second(store, r, world, "g", 10s);  // both alive, interleaved calls
      if (first.instance() != 0 || second.instance() != 1) ++wrong;
      const auto a = first.allgather(bytes("a" + std::to_string(r)));
      const auto b = second.allgather(bytes("b" + std::to_string(r)));
      for (int p = 0; p < world; ++p) {
        if (text(a[static_cast<std::size_t>(p)]) != "a" + std::to_string(p)) ++wrong;
        if (text(b[static_cast<std::size_t>(p)]) != "b" + std::to_string(p)) ++wrong;
      }
      Rendezvous third(store, r, world, "other", 10s);  // another group on the same store
      if (third.instance() != 0) ++wrong;
      third.barrier();
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong, 0);
}

TEST(Rendezvous, ARankThatNeverArrivesIsNamedOnEveryWaitingRank) {
  StoreDir dir;
  const int world = 4;
  std::vector<std::thread> threads;
  std::vector<std::string> errors(world);
  std::vector<double> seconds(world);
  for (int r : {0, 2, 3})  // rank 1 never comes
    threads.emplace_back([&, r] {
      const auto start = std::chrono::steady_clock::now();
      try {
        Rendezvous rv(std::make_shared<FileStore>(dir.path), r, world, "world", 300ms);
      } catch (const Error& e) {
        if (e.code() == ErrorCode::timeout) errors[r] = e.what();
      }
      seconds[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    });
  for (auto& t : threads) t.join();
  for (int r : {0, 2, 3}) {
    EXPECT_NE(errors[r].find("rendezvous 'world' (file store " + dir.path +
                             "): rank 1 of 4 did not arrive at join within 0.3 s"),
              std::string::npos)
        << errors[r];
    EXPECT_LT(seconds[r], 5.0) << "rank " << r << " waited " << seconds[r] << " s";
  }
}

TEST(Rendezvous, MismatchedWorldSizesAreNamed) {
  StoreDir dir;
  std::string small, large;
  std::thread a([&] {
    try {
      Rendezvous(std::make_shared<FileStore>(dir.path), 0, 2, "world", 2s);
    } catch (const Error& e) {
      if (e.code() == ErrorCode::mismatch) small = e.what();
    }
  });
  std::thread b([&] {
    try {
      Rendezvous(std::make_shared<FileStore>(dir.path), 1, 3, "world", 300ms);
    } catch (const Error& e) {
      if (e.code() == ErrorCode::mismatch) large = e.what();
    }
  });
  a.join();
  b.join();
  EXPECT_NE(small.find("rank 0 joined with world size 2 but rank 1 with 3"), std::string::npos)
      << small;
  EXPECT_NE(large.find("rank 1 joined with world size 3 but rank 0 with 2"), std::string::npos)
      << large;
}

TEST(Rendezvous, BadArgumentsAreNamed) {
  StoreDir dir;
  auto store = std::make_shared<FileStore>(dir.path);
  expect_error(ErrorCode::invalid_argument, "rank 3 is out of range [0, 3)",
               [&] { Rendezvous(store, 3, 3, "g", 1s); });
  expect_error(ErrorCode::invalid_argument, "world size 0 is below 1",
               [&] { Rendezvous(store, 0, 0, "g", 1s); });
  Rendezvous one(store, 0, 1, "solo", 1s);
  expect_error(ErrorCode::invalid_argument, "broadcast root 1 is out of range [0, 1)",
               [&] { one.broadcast({}, 1); });
}

// Real processes: three ranks forked from this test meet through a directory; rank 2 then
// SIGKILLs itself before the barrier. The survivors must end with a timeout naming it, within
// their deadline; each writes what it saw to a file the test reads.
TEST(Rendezvous, AKilledProcessIsNamedOnTheSurvivors) {
  StoreDir dir;
  std::filesystem::create_directories(dir.path);
  const int world = 3;
  std::vector<pid_t> children;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      std::string outcome;
      try {
        Rendezvous rv(std::make_shared<FileStore>(dir.path + "/store"), r, world, "world", 2s);
        const auto all = rv.allgather(bytes(std::to_string(::getpid())));
        if (r == 2) ::raise(SIGKILL);
        rv.barrier();
        outcome = "no error (" + std::to_string(all.size()) + ")";
      } catch (const Error& e) {
        outcome = std::string(to_string(e.code())) + ": " + e.what();
      } catch (...) {
        outcome = "unexpected exception";
      }
      std::ofstream(dir.path + "/rank" + std::to_string(r)) << outcome;
      ::_exit(0);
    }
    children.push_back(pid);
  }
  for (int r = 0; r < world; ++r) {
    int status = 0;
    ASSERT_EQ(::waitpid(children[static_cast<std::size_t>(r)], &status, 0),
              children[static_cast<std::size_t>(r)]);
    if (r == 2) {
      EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
      continue;
    }
    std::ifstream in(dir.path + "/rank" + std::to_string(r));
    const std::string seen((std::istreambuf_iterator<char>(in)), {});
    EXPECT_NE(seen.find("timeout: "), std::string::npos) << seen;
    EXPECT_NE(seen.find("rank 2 of 3 did not arrive at barrier 2 within 2 s"), std::string::npos)
        << "rank " << r << " saw: " << seen;
  }
}

TEST(StoreEnvironment, ReadsLoomStoreRankAndWorldSize) {
  StoreDir dir;
  {
    ScopedEnv store("LOOM_STORE", nullptr);
    EXPECT_FALSE(store_from_environment().has_value());
  }
  ScopedEnv store("LOOM_STORE", dir.path.c_str());
  {
    ScopedEnv rank("LOOM_RANK", "1"), world("LOOM_WORLD_SIZE", "3");
    const auto env = store_from_environment();
    ASSERT_TRUE(env.has_value());
    EXPECT_EQ(env->rank, 1);
    EXPECT_EQ(env->world_size, 3);
    EXPECT_EQ(env->store->describe(), "file store " + dir.path);
  }
  {
    ScopedEnv rank("LOOM_RANK", nullptr), world("LOOM_WORLD_SIZE", "3");
    expect_error(ErrorCode::invalid_argument,
                 "needs LOOM_RANK and LOOM_WORLD_SIZE (LOOM_RANK is unset)",
                 [] { store_from_environment(); });
  }
  {
    ScopedEnv rank("LOOM_RANK", "3"), world("LOOM_WORLD_SIZE", "3");
    expect_error(ErrorCode::invalid_argument, "LOOM_RANK=3 is not below LOOM_WORLD_SIZE=3",
                 [] { store_from_environment(); });
  }
  {
    ScopedEnv rank("LOOM_RANK", "x"), world("LOOM_WORLD_SIZE", "3");
    expect_error(ErrorCode::invalid_argument, "LOOM_RANK='x'", [] { store_from_environment(); });
  }
}

}  // namespace
}  // namespace loom
