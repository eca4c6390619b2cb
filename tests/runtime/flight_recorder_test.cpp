// Tests runtime/flight_recorder, rank_board and call_watchdog: the ring keeps the last N
// operations with their states and sequence numbers, its JSON has PyTorch-like fields, the
// board says who is missing and which peer failure makes a run stale, and the watchdog fires (or,
// when it cannot start, refuses the call).
#include "loom/flight_recorder.hpp"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "loom/call_watchdog.hpp"
#include "loom/error.hpp"
#include "loom/rank_board.hpp"

namespace loom {
namespace {

OperationInfo collective(std::string_view name, std::size_t count = 8) {
  return {name, "allreduce", DType::float32, count, "ring", -1, true};
}

TEST(FlightRecorder, KeepsTheLastEntriesWithStatesAndSequences) {
  FlightRecorder recorder(4);
  std::vector<std::string> names;
  for (int k = 0; k < 6; ++k) names.push_back("bucket" + std::to_string(k) + ".allreduce");
  std::uint64_t ids[6];
  std::int64_t seqs[6];
  for (int k = 0; k < 6; ++k)
    ids[k] = recorder.record(collective(names[k], 100 + k), OperationState::scheduled, &seqs[k]);
  const std::uint64_t p2p = recorder.record(
      {"halo.send", "send", DType::int32, 3, "native", 1, false}, OperationState::started);
  recorder.update(ids[4], OperationState::started);
  recorder.update(ids[5], OperationState::completed);
  recorder.update(ids[0], OperationState::completed);  // overwritten slot: ignored
  EXPECT_EQ(seqs[5], 5);
  EXPECT_EQ(recorder.next_collective_seq(), 6);
  const auto entries = recorder.entries();
  ASSERT_EQ(entries.size(), 4u);  // ids 3..6: the ring holds 4
  EXPECT_EQ(entries[0].record_id, 3u);
  EXPECT_EQ(entries[0].profiling_name, "bucket3.allreduce");
  EXPECT_EQ(entries[0].count, 103u);
  EXPECT_EQ(entries[0].state, OperationState::scheduled);
  EXPECT_EQ(entries[1].state, OperationState::started);
  EXPECT_GT(entries[1].time_discovered_started_ns, 0);
  EXPECT_EQ(entries[2].state, OperationState::completed);
  EXPECT_GE(entries[2].time_discovered_completed_ns, entries[2].time_created_ns);
  EXPECT_EQ(entries[2].collective_seq_id, 5);
  EXPECT_EQ(entries[3].record_id, p2p);
  EXPECT_EQ(entries[3].collective_seq_id, -1);
  EXPECT_EQ(entries[3].p2p_seq_id, 0);
  EXPECT_EQ(entries[3].peer, 1);
  EXPECT_EQ(recorder.name_of_collective(4), "bucket4.allreduce");
  EXPECT_EQ(recorder.name_of_collective(0), "");  // gone from the ring
  // Wall-clock times: within a minute of now.
  const auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  EXPECT_LT(std::abs(now - entries[0].time_created_ns), std::int64_t{60'000'000'000});
}

// Power-of-two rings index by mask, others by remainder: both keep exactly the last N.
TEST(FlightRecorder, RingsOfEveryCapacityKeepTheLastEntriesInOrder) {
  for (std::size_t capacity : {1u, 2u, 3u, 5u, 8u, 16u}) {
    FlightRecorder recorder(capacity);
    std::vector<std::uint64_t> ids;
    for (int k = 0; k < 37; ++k)
      ids.push_back(recorder.record(collective("op" + std::to_string(k), k)));
    recorder.update(ids.back(), OperationState::completed);
    recorder.update(ids[36 - capacity], OperationState::completed);  // overwritten: ignored
    const auto entries = recorder.entries();
    ASSERT_EQ(entries.size(), capacity);
    for (std::size_t i = 0; i < capacity; ++i) {
      const std::size_t k = 37 - capacity + i;
      EXPECT_EQ(entries[i].record_id, ids[k]) << "capacity " << capacity;
      EXPECT_EQ(entries[i].profiling_name, "op" + std::to_string(k)) << "capacity " << capacity;
      EXPECT_EQ(entries[i].collective_seq_id, static_cast<std::int64_t>(k));
    }
    EXPECT_EQ(entries.back().state, OperationState::completed);
    if (capacity > 1) {
      EXPECT_EQ(entries.front().state, OperationState::scheduled) << "capacity " << capacity;
    }
  }
}

TEST(FlightRecorder, LongNamesAreCutAndZeroCapacityStillCounts) {
  FlightRecorder none(0);
  none.record(collective("a"));
  none.record(collective("b"));
  EXPECT_EQ(none.next_collective_seq(), 2);
  EXPECT_TRUE(none.entries().empty());
  FlightRecorder one(1);
  one.record(collective(std::string(100, 'x')));
  EXPECT_EQ(one.entries().at(0).profiling_name, std::string(63, 'x'));
}

OperationInfo blocking(std::string_view op, std::size_t count, DType dtype = DType::float32) {
  return {{}, op, dtype, count, "native", -1, true};
}

// Repeated identical blocking calls share one entry; anything that differs, a record in between
// or an unfinished call starts a new one; the sequence numbers still count every call.
TEST(FlightRecorder, RepeatedBlockingCallsCountInOneEntry) {
  FlightRecorder recorder(8);
  std::int64_t seq = -1;
  std::vector<std::uint64_t> ids;
  for (int k = 0; k < 5; ++k) {
    ids.push_back(recorder.record_blocking(blocking("allreduce", 2), seq));
    EXPECT_EQ(seq, k);
    recorder.update(ids.back(), OperationState::completed, false);
  }
  EXPECT_EQ(ids, std::vector<std::uint64_t>(5, ids[0]));
  // Another count, another dtype, another op: each a new entry.
  const auto other_count = recorder.record_blocking(blocking("allreduce", 3), seq);
  EXPECT_EQ(seq, 5);
  recorder.update(other_count, OperationState::completed, false);
  const auto other_dtype = recorder.record_blocking(blocking("allreduce", 3, DType::int32), seq);
  recorder.update(other_dtype, OperationState::completed, false);
  const auto other_op = recorder.record_blocking(blocking("broadcast", 3, DType::int32), seq);
  recorder.update(other_op, OperationState::completed, false);
  EXPECT_EQ(seq, 7);
  // An asynchronous collective in between: the next blocking call gets a new entry.
  std::int64_t async_seq = -1;
  recorder.record(collective("bucket0.allreduce"), OperationState::scheduled, &async_seq);
  EXPECT_EQ(async_seq, 8);
  const auto after_async = recorder.record_blocking(blocking("broadcast", 3, DType::int32), seq);
  EXPECT_EQ(seq, 9);
  EXPECT_NE(after_async, other_op);
  // Not completed (still running or failed): the next call is a new entry.
  const auto again = recorder.record_blocking(blocking("broadcast", 3, DType::int32), seq);
  EXPECT_NE(again, after_async);
  recorder.update(again, OperationState::failed, false);
  const auto after_failure = recorder.record_blocking(blocking("broadcast", 3, DType::int32), seq);
  EXPECT_NE(after_failure, again);
  EXPECT_EQ(seq, 11);
  EXPECT_EQ(recorder.next_collective_seq(), 12);

  const auto entries = recorder.entries();
  ASSERT_EQ(entries.size(), 8u);
  EXPECT_EQ(entries[0].record_id, ids[0]);
  EXPECT_EQ(entries[0].repeats, 4u);
  EXPECT_EQ(entries[0].collective_seq_id, 4);  // the newest call's
  EXPECT_EQ(entries[0].state, OperationState::completed);
  EXPECT_EQ(entries[0].count, 2u);
  EXPECT_EQ(entries[1].repeats, 0u);
  EXPECT_EQ(entries[1].collective_seq_id, 5);
  EXPECT_EQ(entries[7].state, OperationState::started);
  EXPECT_EQ(entries[7].collective_seq_id, 11);
  // Every collective the coalesced entry stands for is found by its number.
  for (std::int64_t s = 0; s <= 4; ++s) EXPECT_EQ(recorder.name_of_collective(s), "allreduce");
  EXPECT_EQ(recorder.name_of_collective(5), "allreduce");
  EXPECT_EQ(recorder.name_of_collective(7), "broadcast");
  EXPECT_EQ(recorder.name_of_collective(8), "bucket0.allreduce");
  // In the dump: the count of repeats, and the newest call's number.
  const std::string json = recorder.to_json(0, 2, "mpi", "test");
  EXPECT_NE(json.find("\"collective_seq_id\": 4, \"p2p_seq_id\": -1"), std::string::npos) << json;
  EXPECT_NE(json.find("\"repeats\": 4}"), std::string::npos) << json;
  // A named blocking call is never folded (its name is not compared).
  const auto named = recorder.record_blocking(collective("x"), seq);
  recorder.update(named, OperationState::completed, false);
  EXPECT_NE(recorder.record_blocking(collective("x"), seq), named);
}

// The ring keeps `capacity` distinct entries however many repeats one holds, and rings of one
// entry keep every call apart.
TEST(FlightRecorder, RepeatsDoNotPushOtherEntriesOut) {
  FlightRecorder recorder(4);
  std::int64_t seq = -1;
  for (int k = 0; k < 3; ++k)
    recorder.update(recorder.record_blocking(blocking("allreduce", 100 + k), seq),
                    OperationState::completed, false);
  for (int k = 0; k < 1000; ++k)
    recorder.update(recorder.record_blocking(blocking("allreduce", 1), seq),
                    OperationState::completed, false);
  const auto entries = recorder.entries();
  ASSERT_EQ(entries.size(), 4u);
  EXPECT_EQ(entries[0].count, 100u);
  EXPECT_EQ(entries[3].repeats, 999u);
  EXPECT_EQ(entries[3].collective_seq_id, 1002);
  EXPECT_EQ(recorder.name_of_collective(3), "allreduce");
  // One more call of the loop, still running: the dump counts the calls before it completed.
  recorder.record_blocking(blocking("allreduce", 1), seq);
  EXPECT_EQ(seq, 1003);
  const std::string json = recorder.to_json(0, 2, "mpi", "test");
  EXPECT_NE(json.find("\"last_started_collective_seq_id\": 1003"), std::string::npos) << json;
  EXPECT_NE(json.find("\"last_completed_collective_seq_id\": 1002"), std::string::npos) << json;

  FlightRecorder one(1);
  for (int k = 0; k < 3; ++k)
    one.update(one.record_blocking(blocking("allreduce", 1), seq), OperationState::completed,
               false);
  EXPECT_EQ(one.entries().at(0).repeats, 0u);
  EXPECT_EQ(one.entries().at(0).record_id, 2u);
}

// A repeat's entry shows the newest call: started when it started, and no completion time
// (left by an earlier call) until it completes.
TEST(FlightRecorder, ARepeatShowsItsNewestCallsTimes) {
  FlightRecorder recorder(8);
  std::int64_t seq = -1;
  const auto id = recorder.record_blocking(blocking("allreduce", 4), seq);
  recorder.update(id, OperationState::completed);  // stamped
  const auto first = recorder.entries().at(0);
  EXPECT_GT(first.time_discovered_completed_ns, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ASSERT_EQ(recorder.record_blocking(blocking("allreduce", 4), seq), id);
  const auto repeat = recorder.entries().at(0);
  EXPECT_EQ(repeat.repeats, 1u);
  EXPECT_EQ(repeat.collective_seq_id, 1);
  EXPECT_EQ(repeat.state, OperationState::started);
  EXPECT_EQ(repeat.time_discovered_completed_ns, 0);
  EXPECT_GE(repeat.time_discovered_started_ns, first.time_discovered_completed_ns + 1'000'000);
  EXPECT_EQ(repeat.time_created_ns, repeat.time_discovered_started_ns);
  recorder.update(id, OperationState::completed, false);
  EXPECT_EQ(recorder.entries().at(0).state, OperationState::completed);
  EXPECT_EQ(recorder.collective_seq_of(id), 1);
}

// A reader copying the ring while a blocking loop counts repeats and another thread records
// asynchronous operations sees whole entries only: each one's numbers consistent with its
// repeats, sequence numbers never reused.
// Also at capacity 2, where the asynchronous records wrap the ring under the blocking loop's
// slot all the time (every writer takes its slot first, so none fills another's).
class FlightRecorderRace : public testing::TestWithParam<std::size_t> {};

INSTANTIATE_TEST_SUITE_P(Capacities, FlightRecorderRace, testing::Values(2u, 64u));

TEST_P(FlightRecorderRace, ReadersSeeWholeEntriesWhileRepeatsAreCounted) {
  FlightRecorder recorder(GetParam());
  std::atomic<bool> stop{false};
  std::thread blocking_loop([&] {
    std::int64_t seq = -1;
    while (!stop.load()) {
      const auto id = recorder.record_blocking(blocking("allreduce", 16), seq);
      recorder.update(id, OperationState::completed, false);
    }
  });
  std::thread async_loop([&] {
    for (int k = 0; k < 2000; ++k) {
      const auto id = recorder.record(collective("bucket", 8));
      recorder.update(id, OperationState::completed);
      std::this_thread::yield();
    }
  });
  for (int read = 0; read < 300; ++read) {
    std::vector<std::pair<std::int64_t, std::int64_t>> spans;  // each entry's first and last
    for (const FlightRecord& r : recorder.entries()) {
      ASSERT_GE(r.collective_seq_id, static_cast<std::int64_t>(r.repeats));
      if (r.profiling_name == "bucket") {
        EXPECT_EQ(r.repeats, 0u);
        EXPECT_EQ(r.count, 8u);
        EXPECT_EQ(r.algorithm, "ring");
      } else {
        EXPECT_EQ(r.profiling_name, "allreduce");
        EXPECT_EQ(r.count, 16u);
        EXPECT_EQ(r.algorithm, "native");
      }
      spans.emplace_back(r.collective_seq_id - static_cast<std::int64_t>(r.repeats),
                         r.collective_seq_id);
    }
    std::sort(spans.begin(), spans.end());
    for (std::size_t k = 1; k < spans.size(); ++k)
      EXPECT_GT(spans[k].first, spans[k - 1].second)
          << "collective #" << spans[k].first << " in two entries";
  }
  async_loop.join();
  stop = true;
  blocking_loop.join();
}

// An update that arrives after its entry's slot was reused (the ring wrapped: a late
// completion of an old operation) changes nothing: it must not mark the entry that now holds
// the slot. The writer checks each entry it records, which nobody else may complete, while
// another thread keeps completing the entry whose slot the writer's next record takes.
TEST_P(FlightRecorderRace, LateUpdatesNeverMarkTheEntryThatReusedTheSlot) {
  FlightRecorder recorder(GetParam());
  std::atomic<std::uint64_t> newest{0};
  std::atomic<bool> stop{false};
  std::thread completer([&] {
    // Stamped updates (under the slot) and unstamped ones (a compare-exchange of its word) in
    // turn.
    for (bool stamp = true; !stop.load(std::memory_order_relaxed); stamp = !stamp) {
      // The entry whose slot the writer's next record takes.
      const std::uint64_t next = newest.load(std::memory_order_acquire) + 1;
      if (next >= GetParam()) recorder.update(next - GetParam(), OperationState::completed, stamp);
    }
  });
  int marked = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
  while (std::chrono::steady_clock::now() < end && marked == 0) {
    const std::uint64_t id = recorder.record(collective("fresh"), OperationState::started);
    for (const FlightRecord& r : recorder.entries())
      if (r.record_id == id && r.state != OperationState::started) ++marked;
    newest.store(id, std::memory_order_release);
  }
  stop = true;
  completer.join();
  EXPECT_EQ(marked, 0) << "an update of an older entry marked the entry that reused its slot";
}

// collective_seq_of(id) while record `id` is being written into a reused slot: its own number,
// or -1 (not there yet, or gone), never the number of the entry the slot held before.
TEST_P(FlightRecorderRace, CollectiveSeqOfNeverAnswersWithThePreviousEntrysNumber) {
  FlightRecorder recorder(GetParam());
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    while (!stop.load(std::memory_order_relaxed))
      recorder.record(collective("c", 8), OperationState::started);
  });
  long wrong = 0, checked = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(1000);
  while (std::chrono::steady_clock::now() < end && wrong == 0) {
    for (int k = 0; k < 1000; ++k) {
      // One writer of collectives only: record k is collective k.
      const std::int64_t newest = recorder.next_collective_seq() - 1;
      if (newest < 0) continue;
      const std::int64_t seq = recorder.collective_seq_of(static_cast<std::uint64_t>(newest));
      if (seq != newest && seq != -1) {
        ADD_FAILURE() << "collective_seq_of(" << newest << ") = " << seq;
        ++wrong;
        break;
      }
      ++checked;
    }
  }
  stop = true;
  writer.join();
  EXPECT_EQ(wrong, 0);
  EXPECT_GT(checked, 0);
}

TEST(FlightRecorder, DumpsJsonWithPyTorchLikeFields) {
  FlightRecorder recorder(8);
  const auto id = recorder.record(collective("grad \"quoted\""), OperationState::started);
  recorder.update(id, OperationState::failed);
  const std::string dir = testing::TempDir() + "loom_fr_test";
  std::filesystem::remove_all(dir);
  const std::string path = recorder.dump(2, 4, "mpi", "timeout in 'x'", dir);
  ASSERT_EQ(path, dir + "/loom_flight_recorder_rank2.json");
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  for (const char* field :
       {"\"rank\": 2", "\"world_size\": 4", "\"backend\": \"mpi\"",
        "\"reason\": \"timeout in 'x'\"", "\"record_id\": 0", "\"collective_seq_id\": 0",
        "\"profiling_name\": \"grad \\\"quoted\\\"\"", "\"state\": \"failed\"",
        "\"input_dtypes\": [\"float32\"]", "\"input_sizes\": [[8]]", "\"algorithm\": \"ring\"",
        "\"time_created_ns\": ", "\"is_p2p\": false"})
    EXPECT_NE(text.str().find(field), std::string::npos) << field << "\n" << text.str();
  EXPECT_EQ(recorder.dump(2, 4, "mpi", "no directory", ""), "");  // LOOM_FLIGHT_RECORDER_DIR unset
  std::filesystem::remove_all(dir);
}

TEST(RankBoard, SaysWhoDidNotArriveAndWhoFailed) {
  std::vector<RankSlot> slots(4);
  std::vector<RankSlot*> pointers{&slots[0], &slots[1], &slots[2], nullptr};  // rank 3: elsewhere
  RankBoard r0(0, pointers), r1(1, pointers), r2(2, pointers);
  FlightRecorder recorder(16);
  for (int k = 0; k < 58; ++k) recorder.record(collective("bucket" + std::to_string(k)));
  r0.started(57);
  r1.started(57);
  r2.started(56);
  r2.completed(56);
  std::string text = r0.who_is_missing(57, recorder);
  EXPECT_NE(text.find("rank 2 did not arrive (last started #56 'bucket56')"), std::string::npos)
      << text;
  EXPECT_EQ(text.find("rank 1 did not arrive"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 3 on another host: not visible"), std::string::npos) << text;
  int failed = -1;
  r2.publish_failure("compute node 'backward1' on rank 2 of 4 failed: NaN", 57, false);
  text = r0.who_is_missing(57, recorder, &failed);
  EXPECT_EQ(failed, 2);
  EXPECT_NE(text.find("it failed: compute node 'backward1'"), std::string::npos) << text;
  // Every visible rank started it: the one that has not completed it is named.
  r2.started(57);
  r0.completed(57);
  r2.completed(57);
  text = r0.who_is_missing(57, recorder);
  EXPECT_NE(text.find("rank 1 started it but has not completed it"), std::string::npos) << text;
}

// Starts and completions from several threads (a blocking call beside the progress thread's
// completions) never move a rank's published numbers back: a peer reads them to name who is
// missing. Three threads take sequence numbers from one counter and publish each at once, as
// the backend does; the test's own thread reads the slot the way a peer does and sees each
// number only grow.
TEST(RankBoard, PublishedNumbersNeverGoBackUnderConcurrentThreads) {
  std::vector<RankSlot> slots(2);
  std::vector<RankSlot*> pointers{&slots[0], &slots[1]};
  RankBoard board(0, pointers), peer(1, pointers);
  constexpr std::int64_t calls = 4000000;
  std::atomic<std::int64_t> next{0};
  std::atomic<int> finished{0};
  auto publish = [&] {
    for (std::int64_t seq = next.fetch_add(1); seq < calls; seq = next.fetch_add(1)) {
      board.started(seq);
      board.completed(seq);
    }
    finished.fetch_add(1);
  };
  // Three publishers on this machine's cores: one is often preempted between reading an
  // entry and writing it, which is when a plain store would move the entry back.
  std::thread a(publish), b(publish), c(publish);
  std::int64_t started = -1, completed = -1;
  int went_back = 0;
  // Until every publisher is done (not until the last number shows: a board that lost it
  // would keep this loop waiting forever instead of failing below).
  while (finished.load() < 3 && went_back == 0) {
    const RankBoard::Peer p = peer.read(0);
    if (p.last_started < started || p.last_completed < completed) ++went_back;
    started = p.last_started;
    completed = p.last_completed;
  }
  a.join();
  b.join();
  c.join();
  EXPECT_EQ(went_back, 0) << "rank 0's published numbers went back (last seen #" << started
                          << " started, #" << completed << " completed)";
  EXPECT_EQ(peer.read(0).last_started, calls - 1);
  EXPECT_EQ(peer.read(0).last_completed, calls - 1);
}

TEST(RankBoard, NamesTheRanksOfOtherHostsAsTheirHostsAnswered) {
  // Ranks 0-1 on host a (visible), 2-3 on host b (answered: 2 started #57, 3 is at #56 and
  // failed), 4-5 on host c (no answer).
  std::vector<RankSlot> slots(2);
  std::vector<RankSlot*> pointers{&slots[0], &slots[1], nullptr, nullptr, nullptr, nullptr};
  RankBoard r0(0, pointers), r1(1, pointers);
  FlightRecorder recorder(16);
  for (int k = 0; k < 58; ++k) recorder.record(collective("bucket" + std::to_string(k)));
  r0.started(57);
  r1.started(57);
  int asked = 0;
  std::int64_t asked_for = -1;
  r0.set_remote({"a", "a", "b", "b", "c", "c"}, [&](std::int64_t seq) {
    ++asked;
    asked_for = seq;
    std::vector<std::optional<RankBoard::Peer>> said(6);
    said[2] = RankBoard::Peer{.visible = true, .last_started = 57, .last_completed = 56};
    said[3] = RankBoard::Peer{.visible = true,
                              .last_started = 56,
                              .last_completed = 56,
                              .failures = 1,
                              .failed_seq = 57,
                              .failure = "compute node 'loss' failed"};
    return said;
  });
  int failed = -1;
  const std::string text = r0.who_is_missing(57, recorder, &failed);
  EXPECT_EQ(asked, 1);  // once per message, not once per rank
  EXPECT_EQ(asked_for, 57);
  EXPECT_EQ(failed, 3);
  EXPECT_EQ(text.find("rank 2"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 3 on host b did not arrive (last started #56 'bucket56'): it failed: "
                      "compute node 'loss' failed"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("ranks 4, 5 on host c are missing: no rank of host c answered"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("not visible"), std::string::npos) << text;
  // One silent rank alone.
  r1.set_remote({"a", "a", "b", "b", "c", "c"}, [](std::int64_t) {
    std::vector<std::optional<RankBoard::Peer>> said(6);
    for (int r : {2, 3, 4}) said[r] = RankBoard::Peer{.visible = true, .last_started = 57};
    return said;
  });
  EXPECT_NE(r1.who_is_missing(57, recorder).find("rank 5 on host c is missing"), std::string::npos);
}

TEST(RankBoard, AStartedRankWithoutAHeartbeatIsNamedApartFromTheLiveOnes) {
  // Ranks 0-2 on host a (visible), 3-5 on host b (answered). Every rank started #57 and none
  // completed it: rank 2's process last beat 3 s ago (stopped), rank 5's 2.5 s ago as its host
  // saw it; the others beat just now.
  std::vector<RankSlot> slots(3);
  std::vector<RankSlot*> pointers{&slots[0], &slots[1], &slots[2], nullptr, nullptr, nullptr};
  RankBoard r0(0, pointers), r1(1, pointers), r2(2, pointers);
  FlightRecorder recorder(16);
  for (int k = 0; k < 58; ++k) recorder.record(collective("bucket" + std::to_string(k)));
  for (RankBoard* board : {&r0, &r1, &r2}) {
    board->started(57);
    board->beat();
  }
  // Without a remote: rank 2 beat a moment ago, so nobody is named silent yet.
  std::string text = r0.who_is_missing(57, recorder);
  EXPECT_NE(text.find("ranks 1, 2 started it but have not completed it"), std::string::npos)
      << text;
  const std::int64_t now = slots[2].alive_ns.load();
  slots[2].alive_ns.store(now - 3'000'000'000);
  r0.set_remote({"a", "a", "a", "b", "b", "b"}, [](std::int64_t) {
    std::vector<std::optional<RankBoard::Peer>> said(6);
    for (int r : {3, 4, 5})
      said[r] = RankBoard::Peer{.visible = true,
                                .last_started = 57,
                                .last_completed = 56,
                                .quiet_s = r == 5 ? 2.5 : 0.01};
    return said;
  });
  text = r0.who_is_missing(57, recorder);
  // The least quiet of the silent ones bounds the claim: neither beat for 2.5 s.
  EXPECT_NE(
      text.find("rank 2, rank 5 on host b started it but their processes have shown no "
                "sign of life for 2.5 s (stopped, frozen or dead); rank 1, ranks 3, 4 on host b "
                "started it and are alive, waiting inside it"),
      std::string::npos)
      << text;
  // A board that never beats (another backend's) makes no claim about liveness.
  std::vector<RankSlot> quiet(2);
  std::vector<RankSlot*> quiet_pointers{&quiet[0], &quiet[1]};
  RankBoard q0(0, quiet_pointers), q1(1, quiet_pointers);
  q0.started(3);
  q1.started(3);
  EXPECT_EQ(q0.read(1).quiet_s, -1);
  text = q0.who_is_missing(3, recorder);
  EXPECT_NE(text.find("rank 1 started it but has not completed it (stopped or stuck inside it)"),
            std::string::npos)
      << text;
}

TEST(RankBoard, ARunIsStaleOnlyWhenAPeerDrainedOneOfItsCollectives) {
  std::vector<RankSlot> slots(2);
  std::vector<RankSlot*> pointers{&slots[0], &slots[1]};
  RankBoard r0(0, pointers), r1(1, pointers);
  r1.publish_failure("after everything was issued", 10, false);  // not drained: data fine
  EXPECT_FALSE(r0.take_stale_run_failure(0, 10).has_value());
  r1.publish_failure("drained from #12", 12, true);  // a later run's
  EXPECT_FALSE(r0.take_stale_run_failure(0, 10).has_value());
  const auto stale = r0.take_stale_run_failure(10, 20);
  ASSERT_TRUE(stale.has_value());
  EXPECT_EQ(stale->rank, 1);
  EXPECT_EQ(stale->seq, 12);
  EXPECT_EQ(stale->message, "drained from #12");
  EXPECT_FALSE(r0.take_stale_run_failure(10, 20).has_value());  // reported once
}

TEST(CallWatchdog, FiresOnceForACallInsideTooLongAndNeverForShortOnes) {
  std::atomic<int> fired{0};
  std::atomic<std::uint64_t> token{0};
  {
    CallWatchdog watchdog;
    watchdog.set_timeout(std::chrono::milliseconds(100));
    watchdog.on_expiry([&](std::uint64_t t) {
      token = t;
      ++fired;
    });
    for (int k = 0; k < 20; ++k) {
      WatchedCall call(watchdog, 1000 + k);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(fired.load(), 0);
    {
      WatchedCall call(watchdog, 77);
      std::this_thread::sleep_for(std::chrono::milliseconds(400));
    }
  }
  EXPECT_EQ(fired.load(), 1);
  EXPECT_EQ(token.load(), 77u);
}

// Back-to-back calls with one token (a loop of repeated blocking calls shares its flight-record
// entry, hence its token) lasting far longer than the timeout in all: each call is short, so the
// monitor never fires, although it almost never samples a moment between two calls.
TEST(CallWatchdog, BackToBackCallsWithOneTokenAreSeparateCalls) {
  std::atomic<int> fired{0};
  {
    CallWatchdog watchdog;
    watchdog.set_timeout(std::chrono::milliseconds(50));
    watchdog.on_expiry([&](std::uint64_t) { ++fired; });
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(400);
    while (std::chrono::steady_clock::now() < end) {
      WatchedCall call(watchdog, 5);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  EXPECT_EQ(fired.load(), 0);
}

// The system refuses the monitor thread (a real refusal: the address space is capped just above
// what the process maps, so no thread stack fits): the watched call is refused with a named
// error before it is made, never made unwatched; once threads can start again, the next call
// starts the monitor. Run in a child process (a death test), which ends with the verdict.
TEST(CallWatchdog, RefusesTheCallWhenItsMonitorCannotStart) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's runtime maps memory of its own for every thread; the cap on the "
                  "address space this test sets would break it, not the watchdog";
#else
  EXPECT_EXIT(
      {
        CallWatchdog watchdog;
        watchdog.set_timeout(std::chrono::seconds(30));
        watchdog.on_expiry([](std::uint64_t) {});
        std::ifstream statm("/proc/self/statm");
        unsigned long long pages = 0;
        statm >> pages;
        rlimit before{};
        getrlimit(RLIMIT_AS, &before);
        rlimit capped = before;  // the soft limit only: it can be raised again
        capped.rlim_cur = pages * 4096ull + (1ull << 20);
        // New threads get stacks larger than any glibc keeps cached from threads that ended
        // (this process ran other tests): each needs a fresh mapping, which the cap refuses.
        pthread_attr_t defaults;
        if (pthread_getattr_default_np(&defaults) != 0) std::_Exit(11);
        pthread_attr_t large = defaults;
        if (pthread_attr_setstacksize(&large, std::size_t{256} << 20) != 0 ||
            pthread_setattr_default_np(&large) != 0)
          std::_Exit(12);
        int verdict = 1;  // the call was made: no error
        if (pages == 0 || setrlimit(RLIMIT_AS, &capped) != 0) std::_Exit(10);
        try {
          WatchedCall call(watchdog, 5);
        } catch (const Error& e) {
          const std::string what = e.what();
          verdict = e.code() == ErrorCode::unavailable &&
                            what.find("could not start its monitor thread") != std::string::npos &&
                            what.find("LOOM_TIMEOUT_S") != std::string::npos
                        ? 0
                        : 2;
        }
        setrlimit(RLIMIT_AS, &before);
        pthread_setattr_default_np(&defaults);
        if (verdict == 0) {
          try {
            WatchedCall call(watchdog, 6);
          } catch (const Error&) {
            verdict = 3;  // the monitor never started, though threads can start now
          }
        }
        std::_Exit(verdict);
      },
      ::testing::ExitedWithCode(0), "");
#endif
}

}  // namespace
}  // namespace loom
