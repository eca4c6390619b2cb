// The local backend: every collective and point-to-point operation on 1-4 thread ranks,
// rendezvous mismatch detection and failure propagation.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "backends/collective_checks.hpp"
#include "expect_error.hpp"
#include "loom/error.hpp"
#include "loom/local.hpp"

namespace loom {
namespace {

using test::expect_error;

using testing::all_collectives;
using testing::standard_counts;

// Runs `fn` on every rank of a local world and collects the non-empty results.
template <class Fn>
std::vector<std::string> on_ranks(int world, Fn fn) {
  std::mutex mutex;
  std::vector<std::string> failures;
  LocalWorld::run(world, [&](Backend& backend) {
    std::string result = fn(backend);
    if (!result.empty()) {
      std::lock_guard lock(mutex);
      failures.push_back(result);
    }
  });
  return failures;
}

class LocalCollectives : public ::testing::TestWithParam<std::tuple<int, Collective, DType>> {};

TEST_P(LocalCollectives, MatchIndependentValues) {
  const auto [world, op, dtype] = GetParam();
  const auto cases = testing::cases_for(op, dtype, standard_counts);
  // Every case in one world: each is collective and every rank runs the whole list in order
  // (the ranks' threads made once; each rank reports its first wrong case).
  auto failures = on_ranks(world, [&](Backend& b) {
    std::string first;
    for (const auto& c : cases)
      if (std::string result = testing::check(b, c); first.empty()) first = std::move(result);
    return first;
  });
  EXPECT_TRUE(failures.empty()) << failures.front();
}

INSTANTIATE_TEST_SUITE_P(AllCases, LocalCollectives,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::ValuesIn(all_collectives),
                                            ::testing::ValuesIn(all_dtypes)),
                         [](const auto& info) {
                           return "np" + std::to_string(std::get<0>(info.param)) + "_" +
                                  std::string(to_string(std::get<1>(info.param))) + "_" +
                                  std::string(to_string(std::get<2>(info.param)));
                         });

class LocalPointToPoint : public ::testing::TestWithParam<std::tuple<int, DType>> {};

TEST_P(LocalPointToPoint, RingExchange) {
  const auto [world, dtype] = GetParam();
  for (std::size_t count : standard_counts) {
    auto failures =
        on_ranks(world, [&](Backend& b) { return testing::check_point_to_point(b, dtype, count); });
    EXPECT_TRUE(failures.empty()) << failures.front();
  }
}

INSTANTIATE_TEST_SUITE_P(AllCases, LocalPointToPoint,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::ValuesIn(all_dtypes)),
                         [](const auto& info) {
                           return "np" + std::to_string(std::get<0>(info.param)) + "_" +
                                  std::string(to_string(std::get<1>(info.param)));
                         });

// Posting a message or starting a collective builds no string: each handle describes itself
// when asked, as before.
TEST(LocalBackend, HandlesDescribeThemselvesWhenAsked) {
  LocalWorld::run(2, [](Backend& b) {
    const int peer = 1 - b.rank();
    std::vector<int> out(3, b.rank()), in(3, -1);
    auto recv = b.recv_async(Buffer::of(std::span(in)), peer, 4);
    auto send = b.send_async(Buffer::of(std::span(out)), peer, 4);
    const std::string at = " on rank " + std::to_string(b.rank()) + " of 2 (local)";
    EXPECT_EQ(recv->description(), "recv" + at);
    EXPECT_EQ(send->description(), "send" + at + " to rank " + std::to_string(peer));
    recv->wait();
    send->wait();
    EXPECT_EQ(in, std::vector<int>(3, peer));
    std::vector<float> v(5, 1.0f);
    auto reduce = b.collective_async({Collective::allreduce, Buffer::of(std::span(v)),
                                      Buffer::of(std::span(v)), ReduceOp::sum, 0});
    EXPECT_EQ(reduce->description(), "allreduce" + at + ": collective #0 allreduce float32[5] sum");
    reduce->wait();
    EXPECT_EQ(v, std::vector<float>(5, 2.0f));
  });
}

TEST(LocalBackend, DifferentCollectivesAtTheSameStepAreAMismatchOnEveryRank) {
  std::atomic<int> mismatches{0};
  // run() rethrows rank 0's error (the first that is not a consequence of another).
  expect_error(
      ErrorCode::mismatch,
      "collective #0: rank 0 called allreduce float32[4] sum but rank 2 called broadcast "
      "float32[4] root 0",
      [&] {
        LocalWorld::run(3, [&](Backend& b) {
          std::vector<float> v(4, 1.0f);
          try {
            if (b.rank() == 2)
              b.broadcast(Buffer::of(std::span(v)), 0);
            else
              b.allreduce(Buffer::of(std::span(v)), ReduceOp::sum);
          } catch (const Error& e) {
            EXPECT_EQ(e.code(), ErrorCode::mismatch);
            EXPECT_NE(std::string(e.what()).find("collective #0"), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find("rank 2 called broadcast"), std::string::npos)
                << e.what();
            ++mismatches;
            throw;
          }
        });
      });
  EXPECT_EQ(mismatches.load(), 3);
}

TEST(LocalBackend, CountMismatchIsDetected) {
  std::atomic<int> mismatches{0};
  expect_error(ErrorCode::mismatch,
               "collective #0: rank 0 called allreduce int32[5] sum but rank 1 called allreduce "
               "int32[6] sum",
               [&] {
                 LocalWorld::run(2, [&](Backend& b) {
                   std::vector<int> v(b.rank() == 0 ? 5 : 6, 1);
                   try {
                     b.allreduce(Buffer::of(std::span(v)), ReduceOp::sum);
                   } catch (const Error& e) {
                     EXPECT_EQ(e.code(), ErrorCode::mismatch) << e.what();
                     ++mismatches;
                     throw;
                   }
                 });
               });
  EXPECT_EQ(mismatches.load(), 2);
}

TEST(LocalBackend, AFailingRankCancelsThePeersWaitingForIt) {
  try {
    LocalWorld::run(3, [](Backend& b) {
      if (b.rank() == 1) throw Error(ErrorCode::internal, "injected failure on rank 1");
      std::vector<double> v(3, 1.0);
      b.allreduce(Buffer::of(std::span(v)), ReduceOp::sum);  // would hang without cancellation
    });
    FAIL() << "run() should rethrow rank 1's failure";
  } catch (const Error& e) {
    // The original error wins over the cancellations it caused.
    EXPECT_EQ(e.code(), ErrorCode::internal);
    EXPECT_NE(std::string(e.what()).find("injected failure on rank 1"), std::string::npos);
  }
}

TEST(LocalBackend, ReceiveOfTheWrongSizeIsAMismatchNamingBothSizes) {
  LocalWorld::run(2, [](Backend& b) {
    if (b.rank() == 0) {
      std::vector<float> v(10, 1.0f);
      b.send(Buffer::of(std::span(v)), 1, 3);
    } else {
      std::vector<float> v(8);
      try {
        b.recv(Buffer::of(std::span(v)), 0, 3);
        ADD_FAILURE() << "expected a mismatch";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::mismatch);
        EXPECT_NE(std::string(e.what()).find("expected 32 bytes"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("has 40 bytes"), std::string::npos) << e.what();
      }
    }
  });
}

TEST(LocalBackend, MessagesFromOneSourceAndTagArriveInOrder) {
  LocalWorld::run(2, [](Backend& b) {
    constexpr int n = 100;
    if (b.rank() == 0) {
      for (int i = 0; i < n; ++i) {
        std::int32_t v = i;
        b.send(Buffer(&v, 1, DType::int32), 1, 5);
      }
    } else {
      std::vector<std::int32_t> got(n, -1);
      std::vector<std::unique_ptr<Work>> works;
      for (int i = 0; i < n; ++i)
        works.push_back(b.recv_async(Buffer(&got[i], 1, DType::int32), 0, 5));
      for (auto& w : works) w->wait();
      for (int i = 0; i < n; ++i) EXPECT_EQ(got[i], i);
    }
  });
}

TEST(LocalBackend, AsyncCollectivesCanBeInFlightTogether) {
  LocalWorld::run(3, [](Backend& b) {
    std::vector<float> a(1000, 1.0f + b.rank()), c(1000, 2.0f);
    auto w1 = b.allreduce_async(Buffer::of(std::span(a)), Buffer::of(std::span(a)), ReduceOp::sum);
    auto w2 = b.allreduce_async(Buffer::of(std::span(c)), Buffer::of(std::span(c)), ReduceOp::max);
    w2->wait();
    w1->wait();
    EXPECT_EQ(a[999], 6.0f);  // 1 + 2 + 3
    EXPECT_EQ(c[0], 2.0f);
  });
}

TEST(LocalBackend, WaitForTimesOutWhileAPeerIsLate) {
  LocalWorld::run(2, [](Backend& b) {
    std::int64_t v = b.rank();
    if (b.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto work =
        b.allreduce_async(Buffer(&v, 1, DType::int64), Buffer(&v, 1, DType::int64), ReduceOp::sum);
    if (b.rank() == 0) EXPECT_FALSE(work->wait_for(std::chrono::milliseconds(10)));
    work->wait();
    EXPECT_EQ(v, 1);
  });
}

TEST(LocalWorld, SizeMustBePositive) {
  expect_error(ErrorCode::invalid_argument, "local world size must be at least 1, got 0",
               [] { LocalWorld(0); });
  LocalWorld world(2);
  expect_error(ErrorCode::invalid_argument, "rank 2 is out of range [0, 2) of this local world",
               [&] { world.backend(2); });
}

}  // namespace
}  // namespace loom
