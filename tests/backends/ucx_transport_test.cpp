// The UCX transport between forked processes meeting through a FileStore: a ring of odd sizes,
// any-source receives, probe and receive_message, size mismatches, the lanes a same-host peer
// gets, and a peer killed while receives from it are posted.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "loom/error.hpp"
#include "loom/store.hpp"
#include "ucx_transport.hpp"

namespace loom::ucx {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(info->test_suite_name()) + "_" + info->name();
    for (char& c : name)
      if (c == '/') c = '_';
    path = (std::filesystem::temp_directory_path() /
            ("loom_ucx_" + std::to_string(::getpid()) + "_" + name))
               .string();
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string path;
};

// What a child reports: "ok" or "error: ..." on the first line, then notes ("lanes: ...").
struct Report {
  std::ostringstream notes;
};

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error(what);
}

void wait(Work& work, const char* what) {
  if (!work.wait_for(20s)) fail(std::string(what) + ": not finished within 20 s");
}

// Runs `body(rank, transport, store, report)` in `world` forked processes; returns each rank's
// report file ("" for a rank that wrote none) and how each exited.
struct Outcome {
  std::vector<std::string> reports;
  std::vector<int> statuses;
};
using Body = std::function<void(int, Transport&, Store&, Report&)>;

Outcome run_ranks(const std::string& dir, int world, const Body& body) {
  std::vector<pid_t> children;
  for (int rank = 0; rank < world; ++rank) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      Report report;
      std::string first = "ok";
      try {
        auto store = std::make_shared<FileStore>(dir + "/store");
        Rendezvous rendezvous(store, rank, world, "ucx-test", 20s);
        Transport transport(rendezvous);
        body(rank, transport, *store, report);
      } catch (const std::exception& e) {
        first = std::string("error: ") + e.what();
      }
      std::ofstream(dir + "/report." + std::to_string(rank)) << first << "\n" << report.notes.str();
      ::_exit(0);
    }
    children.push_back(pid);
  }
  Outcome outcome;
  outcome.statuses.assign(static_cast<std::size_t>(world), -1);
  const auto deadline = Clock::now() + 90s;
  int left = world;
  while (left > 0) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (int r = 0; r < world; ++r)
        if (children[static_cast<std::size_t>(r)] == pid)
          outcome.statuses[static_cast<std::size_t>(r)] = status;
      --left;
      continue;
    }
    if (Clock::now() > deadline) {
      for (pid_t child : children) ::kill(child, SIGKILL);
      ADD_FAILURE() << "ranks still running after 90 s: killed";
    }
    std::this_thread::sleep_for(5ms);
  }
  for (int r = 0; r < world; ++r) {
    std::ifstream in(dir + "/report." + std::to_string(r));
    std::stringstream text;
    text << in.rdbuf();
    outcome.reports.push_back(text.str());
  }
  return outcome;
}

std::byte pattern(int source, std::size_t size, std::size_t i) {
  return static_cast<std::byte>((i * 131 + size * 7 + static_cast<std::size_t>(source) * 29) &
                                0xff);
}

// Expects `work` to fail with `code` and a message holding every fragment.
void expect_failure(Work& work, ErrorCode code, const std::vector<std::string>& fragments,
                    const char* what) {
  try {
    if (!work.wait_for(20s)) fail(std::string(what) + ": not finished within 20 s");
  } catch (const Error& e) {
    if (e.code() != code)
      fail(std::string(what) + ": expected " + std::string(to_string(code)) + ", got " + e.what());
    for (const auto& fragment : fragments)
      if (e.message().find(fragment) == std::string::npos)
        fail(std::string(what) + ": '" + fragment + "' missing from " + e.what());
    return;
  }
  fail(std::string(what) + ": no error; expected " + std::string(to_string(code)));
}

void exchange(int rank, Transport& transport, Store&, Report& report) {
  const int world = transport.world_size();
  const int next = (rank + 1) % world;
  const int previous = (rank + world - 1) % world;

  // A ring of odd sizes, checked byte for byte.
  const std::size_t sizes[] = {0, 1, 7, (std::size_t{1} << 20) + 3};
  for (std::uint32_t k = 0; k < 4; ++k) {
    const std::size_t size = sizes[k];
    std::vector<std::byte> out(size);
    std::vector<std::byte> in(size, std::byte{0xee});
    for (std::size_t i = 0; i < size; ++i) out[i] = pattern(rank, size, i);
    auto receive = transport.recv(in.data(), size, previous, k);
    auto send = transport.send(out.data(), size, next, k);
    wait(*send, "ring send");
    wait(*receive, "ring recv");
    if (receive->source() != previous || receive->bytes() != size)
      fail("ring recv of " + std::to_string(size) + " bytes: source " +
           std::to_string(receive->source()) + ", " + std::to_string(receive->bytes()) + " bytes");
    for (std::size_t i = 0; i < size; ++i)
      if (in[i] != pattern(previous, size, i))
        fail("ring of " + std::to_string(size) + " bytes: byte " + std::to_string(i) + " wrong");
  }

  // Any-source receives at rank 0 name each sender.
  const int sent = rank;
  auto to_root = transport.send(&sent, sizeof sent, 0, 100);
  if (rank == 0) {
    std::set<int> sources;
    for (int i = 0; i < world; ++i) {
      int value = -1;
      auto receive = transport.recv(&value, sizeof value, any_source, 100);
      wait(*receive, "any-source recv");
      if (receive->source() != value)
        fail("any-source recv: source() " + std::to_string(receive->source()) + " but rank " +
             std::to_string(value) + " sent it");
      sources.insert(value);
    }
    if (static_cast<int>(sources.size()) != world) fail("any-source recv: a sender missing");
  }
  wait(*to_root, "send to rank 0");

  // probe + receive_message of a size the receiver does not know.
  std::vector<std::byte> message(1000 + static_cast<std::size_t>(rank) * 37 + 70000 * (rank % 2));
  for (std::size_t i = 0; i < message.size(); ++i) message[i] = pattern(rank, message.size(), i);
  auto send = transport.send(message.data(), message.size(), next, 200);
  const std::size_t expected =
      1000 + static_cast<std::size_t>(previous) * 37 + 70000 * (previous % 2);
  std::optional<ProbedMessage> probed;
  for (auto deadline = Clock::now() + 20s; !probed && Clock::now() < deadline;)
    probed = transport.probe(previous, 200);
  if (!probed || probed->source != previous || probed->bytes != expected)
    fail("probe: expected " + std::to_string(expected) + " bytes from rank " +
         std::to_string(previous));
  auto receive = transport.receive_message(any_source, 200);
  wait(*receive, "receive_message");
  const Message got = receive->take();
  if (got.source != previous || got.bytes.size() != expected)
    fail("receive_message: " + std::to_string(got.bytes.size()) + " bytes from rank " +
         std::to_string(got.source));
  for (std::size_t i = 0; i < expected; ++i)
    if (got.bytes[i] != pattern(previous, expected, i)) fail("receive_message: data wrong");
  wait(*send, "send to receive_message");
  if (transport.probe(any_source, 200)) fail("probe: a message left after receive_message");

  // Longer and shorter than the posted receive: eager (16 into 8) and rendezvous (1 MiB + 3
  // into 1 MiB), then 4 into 8.
  std::vector<std::byte> big((std::size_t{1} << 20) + 3);
  std::vector<std::byte> buffer(std::size_t{1} << 20);
  auto long_send = transport.send(big.data(), 16, next, 300);
  auto long_receive = transport.recv(buffer.data(), 8, previous, 300);
  expect_failure(*long_receive, ErrorCode::mismatch,
                 {"rank " + std::to_string(previous), "16 bytes", "8 bytes"}, "16 into 8");
  wait(*long_send, "send of 16");
  auto huge_send = transport.send(big.data(), big.size(), next, 301);
  auto huge_receive = transport.recv(buffer.data(), buffer.size(), previous, 301);
  expect_failure(*huge_receive, ErrorCode::mismatch,
                 {"rank " + std::to_string(previous), std::to_string(big.size()) + " bytes",
                  std::to_string(buffer.size()) + " bytes"},
                 "1 MiB + 3 into 1 MiB");
  huge_send->wait_for(5s);  // UCX may fail or complete a truncated rendezvous send
  auto short_send = transport.send(big.data(), 4, next, 302);
  auto short_receive = transport.recv(buffer.data(), 8, previous, 302);
  expect_failure(*short_receive, ErrorCode::mismatch,
                 {"rank " + std::to_string(previous), "4 bytes", "8 bytes"}, "4 into 8");
  wait(*short_send, "send of 4");

  if (world > 1) report.notes << "lanes: " << transport.lanes(next) << "\n";
}

class UcxTransport : public ::testing::TestWithParam<int> {};

TEST_P(UcxTransport, ExchangesBetweenForkedRanks) {
  TempDir dir;
  const int world = GetParam();
  const auto started = Clock::now();
  const Outcome outcome = run_ranks(dir.path, world, exchange);
  std::cout << "world " << world << ": "
            << std::chrono::duration<double>(Clock::now() - started).count() << " s\n";
  for (int r = 0; r < world; ++r) {
    const auto& report = outcome.reports[static_cast<std::size_t>(r)];
    EXPECT_TRUE(WIFEXITED(outcome.statuses[static_cast<std::size_t>(r)])) << "rank " << r;
    EXPECT_EQ(report.rfind("ok\n", 0), 0u) << "rank " << r << ": " << report;
    if (world > 1) {
      std::cout << "rank " << r << " " << report.substr(report.find('\n') + 1);
      const bool shared_memory = report.find("posix") != std::string::npos ||
                                 report.find("sysv") != std::string::npos ||
                                 report.find("cma") != std::string::npos;
      EXPECT_TRUE(shared_memory) << "rank " << r << " has no shared-memory lane: " << report;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, UcxTransport, ::testing::Values(1, 2, 3, 5),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

// Rank 2 of 3 kills itself while ranks 0 and 1 have a receive posted from it and an any-source
// receive; both fail with peer_failed naming rank 2, a send to it fails, and 0 and 1 still talk.
void killed_peer(int rank, Transport& transport, Store& store, Report& report) {
  std::uint64_t token = 0;
  auto send = transport.send(&token, sizeof token, (rank + 1) % 3, 1);
  auto receive = transport.recv(&token, sizeof token, (rank + 2) % 3, 1);
  wait(*send, "warm-up send");
  wait(*receive, "warm-up recv");
  const std::byte one[1] = {std::byte{1}};
  if (rank == 2) {
    const std::vector<std::string> posted = {"test/posted/0", "test/posted/1"};
    if (!store.wait(posted, Clock::now() + 20s).empty()) fail("ranks 0 and 1 did not post");
    const auto now = Clock::now().time_since_epoch().count();
    std::vector<std::byte> when(sizeof now);
    std::memcpy(when.data(), &now, sizeof now);
    store.set("test/killed_at", when);
    std::raise(SIGKILL);
  }
  char from_two[64];
  char from_any[64];
  auto specific = transport.recv(from_two, sizeof from_two, 2, 7);
  auto any = transport.recv(from_any, sizeof from_any, any_source, 8);
  store.set("test/posted/" + std::to_string(rank), one);
  for (auto deadline = Clock::now() + 30s;
       !(specific->finished() && any->finished()) && Clock::now() < deadline;) {
    specific->test();
    any->test();
    std::this_thread::sleep_for(1ms);
  }
  const auto finished = Clock::now();
  const auto when = store.try_get("test/killed_at");
  if (!when) fail("rank 2 did not record when it died");
  Clock::rep killed_at = 0;
  std::memcpy(&killed_at, when->data(), sizeof killed_at);
  const double seconds =
      std::chrono::duration<double>(finished - Clock::time_point(Clock::duration(killed_at)))
          .count();
  const std::vector<std::string> names = {"rank 2 (host ", ") failed: "};
  expect_failure(*specific, ErrorCode::peer_failed, names, "recv from rank 2");
  expect_failure(*any, ErrorCode::peer_failed, names, "any-source recv");
  auto to_dead = transport.send(&token, sizeof token, 2, 9);
  expect_failure(*to_dead, ErrorCode::peer_failed, names, "send to rank 2");
  report.notes << "detected after " << seconds << " s\n";
  report.notes << "failure: " << transport.failure_of(2) << "\n";
  try {
    specific->wait();
  } catch (const Error& e) {
    report.notes << "error: " << e.what() << "\n";
  }

  // The survivors still talk.
  int value = rank == 0 ? 42 : 0;
  auto survivor = rank == 0 ? transport.send(&value, sizeof value, 1, 10)
                            : std::unique_ptr<Work>(transport.recv(&value, sizeof value, 0, 10));
  wait(*survivor, "survivors' exchange");
  if (value != 42) fail("survivors' exchange: wrong value");
}

TEST(UcxTransportFailure, KilledPeerFailsPostedReceives) {
  TempDir dir;
  const Outcome outcome = run_ranks(dir.path, 3, killed_peer);
  EXPECT_TRUE(WIFSIGNALED(outcome.statuses[2]) && WTERMSIG(outcome.statuses[2]) == SIGKILL);
  for (int r = 0; r < 2; ++r) {
    const auto& report = outcome.reports[static_cast<std::size_t>(r)];
    std::cout << "rank " << r << ": " << report;
    ASSERT_EQ(report.rfind("ok\n", 0), 0u) << "rank " << r << ": " << report;
    const auto at = report.find("detected after ");
    ASSERT_NE(at, std::string::npos);
    const double seconds = std::stod(report.substr(at + 15));
    EXPECT_LT(seconds, 10.0) << "rank " << r;
  }
}

// A rank that ends on a peer's failure closes its endpoints abruptly (its process exits): a rank
// waiting on it names the peer that failed first, which that rank left on the store.
void cascaded_failure(int rank, Transport& transport, Store& store, Report& report) {
  std::uint64_t token = 0;
  auto send = transport.send(&token, sizeof token, (rank + 1) % 3, 1);
  auto receive = transport.recv(&token, sizeof token, (rank + 2) % 3, 1);
  wait(*send, "warm-up send");
  wait(*receive, "warm-up recv");
  const std::byte one[1] = {std::byte{1}};
  char buffer[64];
  if (rank == 2) {
    const std::vector<std::string> posted = {"test/posted/1"};
    if (!store.wait(posted, Clock::now() + 20s).empty()) fail("rank 1 did not post");
    std::raise(SIGKILL);
  }
  if (rank == 0) {
    auto from_two = transport.recv(buffer, sizeof buffer, 2, 7);
    expect_failure(*from_two, ErrorCode::peer_failed, {"rank 2 (host ", ") failed: "},
                   "recv from rank 2");
    ::_exit(0);  // as a program that ends on its error: no teardown, no report
  }
  auto from_zero = transport.recv(buffer, sizeof buffer, 0, 11);
  store.set("test/posted/1", one);
  expect_failure(*from_zero, ErrorCode::peer_failed,
                 {"rank 0 (host ", "(rank 0 had failed first on: rank 2 (host "},
                 "recv from rank 0");
  try {
    from_zero->wait();
  } catch (const Error& e) {
    report.notes << "error: " << e.what() << "\n";
  }
}

TEST(UcxTransportFailure, ARankEndingOnAPeersFailureNamesThatPeerToTheOthers) {
  TempDir dir;
  const Outcome outcome = run_ranks(dir.path, 3, cascaded_failure);
  const auto& report = outcome.reports[1];
  std::cout << "rank 1: " << report;
  EXPECT_EQ(report.rfind("ok\n", 0), 0u) << report;
}

}  // namespace
}  // namespace loom::ucx
