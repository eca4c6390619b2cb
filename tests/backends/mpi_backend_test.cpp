// MPI-specific behaviour of the mpi backend (thread level, communicators, messages of the wrong
// or unknown size, probing, tags, LOOM_MPI_CUDA_AWARE); run under mpirun with 1 to 4 ranks.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "expect_error.hpp"
#include "loom/cuda_device.hpp"
#include "loom/error.hpp"
#include "loom/mpi.hpp"
#include "scoped_env.hpp"

#if __has_include(<mpi.h>)
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#define LOOM_TEST_HAS_MPI_H 1
#endif

namespace loom {
namespace {

using test::expect_error;

Backend& world() {
  static std::shared_ptr<Backend> backend = make_mpi_backend();
  return *backend;
}

int next_rank(const Backend& b) {
  return (b.rank() + 1) % b.world_size();
}
int previous_rank(const Backend& b) {
  return (b.rank() + b.world_size() - 1) % b.world_size();
}

// Every test ends here so that one rank's failure cannot leave the others inside a collective
// or receive messages meant for the next test.
void all_ranks_agree(bool ok) {
  std::int32_t bad = ok ? 0 : 1;
  world().allreduce(Buffer(&bad, 1, DType::int32), ReduceOp::sum);
  EXPECT_EQ(bad, 0) << bad << " rank(s) failed";
}

// Sum over ranks r of (r + 1) * (i + 1): what allreduce(sum) of the inputs below must give.
std::vector<std::int64_t> expected_sums(int world, std::size_t count) {
  const std::int64_t rank_sum = std::int64_t(world) * (world + 1) / 2;
  std::vector<std::int64_t> out(count);
  for (std::size_t i = 0; i < count; ++i) out[i] = rank_sum * std::int64_t(i + 1);
  return out;
}

std::vector<std::int64_t> inputs(int rank, std::size_t count) {
  std::vector<std::int64_t> in(count);
  for (std::size_t i = 0; i < count; ++i) in[i] = std::int64_t(rank + 1) * std::int64_t(i + 1);
  return in;
}

TEST(MpiBackend, ProvidesThreadMultiple) {
  MpiConfig config;
  config.require_thread_multiple = true;
  std::shared_ptr<Backend> backend;
  EXPECT_NO_THROW(backend = make_mpi_backend(config));
#ifdef LOOM_TEST_HAS_MPI_H
  int initialised = 0;
  MPI_Initialized(&initialised);
  EXPECT_EQ(initialised, 1);
  int level = -1;
  MPI_Query_thread(&level);
  EXPECT_EQ(level, MPI_THREAD_MULTIPLE);
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(size, world().world_size());
#endif
  EXPECT_EQ(backend->name(), "mpi");
  if (const char* size = std::getenv("OMPI_COMM_WORLD_SIZE")) {
    EXPECT_EQ(backend->world_size(), std::atoi(size));
  }
  if (const char* rank = std::getenv("OMPI_COMM_WORLD_RANK")) {
    EXPECT_EQ(backend->rank(), std::atoi(rank));
  }
  all_ranks_agree(!::testing::Test::HasFailure());
}

TEST(MpiBackend, SeveralBackendsAreIndependentCommunicators) {
  auto a = make_mpi_backend();
  auto b = make_mpi_backend();
  const int n = a->world_size();
  ASSERT_EQ(b->world_size(), n);
  ASSERT_EQ(b->rank(), a->rank());
  bool ok = true;

  // Collectives in flight on both at once, finished in the opposite order.
  auto in_a = inputs(a->rank(), 1000);
  std::vector<std::int64_t> in_b(10, a->rank());
  auto wa =
      a->allreduce_async(Buffer::of(std::span(in_a)), Buffer::of(std::span(in_a)), ReduceOp::sum);
  auto wb =
      b->allreduce_async(Buffer::of(std::span(in_b)), Buffer::of(std::span(in_b)), ReduceOp::max);
  wb->wait();
  wa->wait();
  ok &= in_a == expected_sums(n, 1000);
  ok &= in_b == std::vector<std::int64_t>(10, n - 1);
  EXPECT_TRUE(ok);

  // Same peer, same tag on both: a message never crosses to the other communicator, even
  // when the receives are posted in the opposite order.
  std::int32_t to_a = 100 + a->rank(), to_b = 200 + a->rank(), from_a = -1, from_b = -1;
  auto sa = a->send_async(Buffer(&to_a, 1, DType::int32), next_rank(*a), 7);
  auto sb = b->send_async(Buffer(&to_b, 1, DType::int32), next_rank(*b), 7);
  b->recv(Buffer(&from_b, 1, DType::int32), previous_rank(*b), 7);
  a->recv(Buffer(&from_a, 1, DType::int32), previous_rank(*a), 7);
  sa->wait();
  sb->wait();
  EXPECT_EQ(from_a, 100 + previous_rank(*a));
  EXPECT_EQ(from_b, 200 + previous_rank(*b));
  ok &= from_a == 100 + previous_rank(*a) && from_b == 200 + previous_rank(*b);

  // Dropping one backend leaves the other, and new ones, working.
  b.reset();
  auto c = make_mpi_backend();
  std::int64_t one = 1;
  c->allreduce(Buffer(&one, 1, DType::int64), ReduceOp::sum);
  std::int64_t two = 2;
  a->allreduce(Buffer(&two, 1, DType::int64), ReduceOp::sum);
  EXPECT_EQ(one, n);
  EXPECT_EQ(two, 2 * n);
  ok &= one == n && two == 2 * n;
  all_ranks_agree(ok);
}

TEST(MpiBackend, ConcurrentAllreducesOnTwoBackendsFromTwoThreads) {
  auto a = make_mpi_backend();
  auto b = make_mpi_backend();
  const int n = a->world_size(), me = a->rank();
  auto run = [&](Backend& backend, int salt, bool& ok) {
    ok = true;
    for (int iteration = 0; iteration < 50; ++iteration) {
      const std::size_t count = 1 + std::size_t(iteration * 977 + salt) % 20000;
      std::vector<double> data(count);
      for (std::size_t i = 0; i < count; ++i)
        data[i] = double((me + 1) * (salt + iteration + i % 7));
      std::vector<double> out(count);
      backend.allreduce(Buffer::of(std::span(data)), Buffer::of(std::span(out)), ReduceOp::sum);
      const double rank_sum = double(n) * (n + 1) / 2;
      for (std::size_t i = 0; i < count; ++i)
        if (out[i] != rank_sum * double(salt + iteration + i % 7)) ok = false;
    }
  };
  bool ok_a = false, ok_b = false;
  std::thread ta([&] { run(*a, 1, ok_a); });
  std::thread tb([&] { run(*b, 1000, ok_b); });
  ta.join();
  tb.join();
  EXPECT_TRUE(ok_a);
  EXPECT_TRUE(ok_b);
  all_ranks_agree(ok_a && ok_b);
}

// Receives `received` int32 elements where `sent` were sent; returns the error it raised.
std::optional<Error> receive_wrong_size(std::size_t sent, std::size_t received, int tag) {
  Backend& b = world();
  std::vector<std::int32_t> out(sent, b.rank()), in(received, -1);
  auto send = b.send_async(Buffer::of(std::span(out)), next_rank(b), tag);
  std::optional<Error> error;
  try {
    b.recv(Buffer::of(std::span(in)), previous_rank(b), tag);
  } catch (const Error& e) {
    error = e;
  }
  send->wait();
  return error;
}

TEST(MpiBackend, ShorterMessageThanBufferIsMismatch) {
  const auto error = receive_wrong_size(8, 16, 11);
  bool ok = error.has_value();
  if (error) {
    const std::string m = error->message();
    EXPECT_EQ(error->code(), ErrorCode::mismatch);
    EXPECT_NE(m.find("expected 64 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("has 32 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("from rank " + std::to_string(previous_rank(world()))), std::string::npos)
        << m;
    EXPECT_NE(m.find("tag 11"), std::string::npos) << m;
    EXPECT_NE(m.find("recv on rank " + std::to_string(world().rank())), std::string::npos) << m;
    ok &= error->code() == ErrorCode::mismatch;
  }
  EXPECT_TRUE(error.has_value()) << "receiving 32 bytes into 64 did not fail";
  all_ranks_agree(ok);
}

TEST(MpiBackend, LongerMessageThanBufferIsMismatch) {
  const auto error = receive_wrong_size(16, 8, 12);
  bool ok = error.has_value();
  if (error) {
    const std::string m = error->message();
    EXPECT_EQ(error->code(), ErrorCode::mismatch);
    EXPECT_NE(m.find("expected 32 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("more than 32 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("tag 12"), std::string::npos) << m;
    ok &= error->code() == ErrorCode::mismatch;
  }
  EXPECT_TRUE(error.has_value()) << "receiving 64 bytes into 32 did not fail";
  // The backend still works after the failed receive.
  std::int32_t x = 1;
  world().allreduce(Buffer(&x, 1, DType::int32), ReduceOp::sum);
  EXPECT_EQ(x, world().world_size());
  all_ranks_agree(ok && x == world().world_size());
}

// Posting a message builds no string (loom's algorithms post several per collective): its
// description is made when asked, and names the rank, buffer, peer and tag as before.
TEST(MpiBackend, MessagesDescribeThemselvesWhenAsked) {
  Backend& b = world();
  const int to = next_rank(b), from = previous_rank(b);
  std::vector<std::int32_t> out(4, b.rank()), out2(3, b.rank()), in(4, -1), any(3, -1);
  auto recv = b.recv_async(Buffer::of(std::span(in)), from, 7);
  auto recv_any = b.recv_async(Buffer::of(std::span(any)), any_source, any_tag);
  auto send = b.send_async(Buffer::of(std::span(out)), to, 7);
  auto send2 = b.send_async(Buffer::of(std::span(out2)), to, 8);
  const std::string at = " on rank " + std::to_string(b.rank()) + " of " +
                         std::to_string(b.world_size()) + " (mpi): int32[";
  EXPECT_EQ(recv->description(),
            "recv" + at + "4]@cpu from rank " + std::to_string(from) + " tag 7");
  EXPECT_EQ(recv_any->description(), "recv" + at + "3]@cpu from any rank tag any");
  EXPECT_EQ(send->description(), "send" + at + "4]@cpu to rank " + std::to_string(to) + " tag 7");
  EXPECT_EQ(send2->description(), "send" + at + "3]@cpu to rank " + std::to_string(to) + " tag 8");
  recv->wait();
  recv_any->wait();
  send->wait();
  send2->wait();
  EXPECT_EQ(in, std::vector<std::int32_t>(4, from));
  EXPECT_EQ(any, std::vector<std::int32_t>(3, from));
  all_ranks_agree(in == std::vector<std::int32_t>(4, from) &&
                  any == std::vector<std::int32_t>(3, from));
}

// Starting a collective builds no string either: the handle names it when asked, with the
// details each collective's errors give.
TEST(MpiBackend, CollectivesDescribeThemselvesWhenAsked) {
  Backend& b = world();
  const int n = b.world_size();
  const std::string at =
      " on rank " + std::to_string(b.rank()) + " of " + std::to_string(n) + " (mpi)";
  std::vector<float> v(6, 2.0f), gathered(6 * static_cast<std::size_t>(n));
  std::vector<float> scattered(6 * static_cast<std::size_t>(n), 1.0f), part(6);
  auto reduce = b.collective_async({Collective::allreduce, Buffer::of(std::span(v)),
                                    Buffer::of(std::span(v)), ReduceOp::avg, 0});
  EXPECT_EQ(reduce->description(), "allreduce" + at + ": float32[6]@cpu avg");
  reduce->wait();
  EXPECT_EQ(v, std::vector<float>(6, 2.0f));  // the average of equal values, divided once
  auto root = b.collective_async({Collective::reduce, Buffer::of(std::span(v)),
                                  Buffer::of(std::span(v)), ReduceOp::max, n - 1});
  EXPECT_EQ(root->description(),
            "reduce" + at + ": float32[6]@cpu max root " + std::to_string(n - 1));
  root->wait();
  auto bcast = b.collective_async({Collective::broadcast, Buffer::of(std::span(v)),
                                   Buffer::of(std::span(v)), ReduceOp::sum, 0});
  EXPECT_EQ(bcast->description(), "broadcast" + at + ": float32[6]@cpu root 0");
  bcast->wait();
  auto gather = b.collective_async({Collective::allgather, Buffer::of(std::span(v)),
                                    Buffer::of(std::span(gathered)), ReduceOp::sum, 0});
  EXPECT_EQ(gather->description(),
            "allgather" + at + ": float32[6]@cpu -> float32[" + std::to_string(6 * n) + "]@cpu");
  gather->wait();
  auto scatter = b.collective_async({Collective::reduce_scatter, Buffer::of(std::span(scattered)),
                                     Buffer::of(std::span(part)), ReduceOp::sum, 0});
  EXPECT_EQ(scatter->description(),
            "reduce_scatter" + at + ": float32[" + std::to_string(6 * n) + "]@cpu sum");
  scatter->wait();
  auto barrier = b.collective_async({Collective::barrier, {}, {}, ReduceOp::sum, 0});
  EXPECT_EQ(barrier->description(), "barrier" + at);
  barrier->wait();
  EXPECT_EQ(gathered, std::vector<float>(gathered.size(), 2.0f));
  EXPECT_EQ(part, std::vector<float>(6, static_cast<float>(n)));
  all_ranks_agree(gathered == std::vector<float>(gathered.size(), 2.0f) &&
                  part == std::vector<float>(6, static_cast<float>(n)));
}

TEST(MpiBackend, RecvMessageOfUnknownSizeFromAnySource) {
  Backend& b = world();
  const int n = b.world_size(), me = b.rank();
  // Every rank sends rank 0 a message of 3 * (rank + 1) bytes with tag 100 + rank.
  std::vector<std::uint8_t> out(3 * std::size_t(me + 1));
  std::iota(out.begin(), out.end(), std::uint8_t(me * 10));
  auto send = b.send_async(Buffer::of(std::span(out)), 0, 100 + me);
  bool ok = true;
  if (me == 0) {
    std::vector<bool> seen(n, false);
    for (int k = 0; k < n; ++k) {
      Message m = b.recv_message(any_source, any_tag);
      const int r = m.source;
      EXPECT_TRUE(r >= 0 && r < n) << r;
      if (r < 0 || r >= n) {
        ok = false;
        continue;
      }
      EXPECT_FALSE(seen[r]) << "two messages from rank " << r;
      seen[r] = true;
      EXPECT_EQ(m.tag, 100 + r);
      EXPECT_EQ(m.data.size(), 3 * std::size_t(r + 1));
      bool content = m.data.size() == 3 * std::size_t(r + 1);
      for (std::size_t i = 0; content && i < m.data.size(); ++i)
        content = m.data[i] == std::byte(r * 10 + i);
      EXPECT_TRUE(content) << "payload from rank " << r;
      ok &= m.tag == 100 + r && content;
    }
  }
  send->wait();
  b.barrier();  // rank 0 has taken every message above before anyone sends the next one
  // A zero-byte message is a message too.
  {
    auto empty = b.send_async(Buffer(nullptr, 0, DType::uint8), next_rank(b), 5);
    Message m = b.recv_message(previous_rank(b), 5);
    empty->wait();
    EXPECT_EQ(m.source, previous_rank(b));
    EXPECT_EQ(m.tag, 5);
    EXPECT_TRUE(m.data.empty());
    ok &= m.data.empty() && m.source == previous_rank(b);
  }
  all_ranks_agree(ok);
}

TEST(MpiBackend, ProbeReportsSourceTagAndBytes) {
  Backend& b = world();
  const int me = b.rank(), from = previous_rank(b);
  // Nothing is ever sent with tag 43 to anyone.
  EXPECT_FALSE(b.try_probe(any_source, 43).has_value());
  std::vector<float> out(5 * std::size_t(me + 1), float(me));
  auto send = b.send_async(Buffer::of(std::span(out)), next_rank(b), 42);
  const Status status = b.probe(from, 42);
  EXPECT_EQ(status.source, from);
  EXPECT_EQ(status.tag, 42);
  EXPECT_EQ(status.bytes, 5 * std::size_t(from + 1) * sizeof(float));
  // Probing does not consume: a wildcard probe sees the same message, then a recv takes it.
  std::optional<Status> again;
  while (!(again = b.try_probe(any_source, any_tag))) std::this_thread::yield();
  EXPECT_EQ(again->source, from);
  EXPECT_EQ(again->bytes, status.bytes);
  std::vector<float> in(status.bytes / sizeof(float), -1.0f);
  b.recv(Buffer::of(std::span(in)), status.source, status.tag);
  send->wait();
  EXPECT_EQ(in, std::vector<float>(in.size(), float(from)));
  all_ranks_agree(!::testing::Test::HasFailure());
}

TEST(MpiBackend, TagsFollowMpiTagUb) {
  Backend& b = world();
  std::int32_t x = 0;
  try {
    b.send_async(Buffer(&x, 1, DType::int32), next_rank(b), -5);
    ADD_FAILURE() << "tag -5 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument) << e.what();
  }
  int tag_ub = std::numeric_limits<int>::max();
#ifdef LOOM_TEST_HAS_MPI_H
  int* attribute = nullptr;
  int found = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &attribute, &found);
  ASSERT_TRUE(found);
  tag_ub = *attribute;
#endif
  if (tag_ub < std::numeric_limits<int>::max()) {
    try {
      b.send_async(Buffer(&x, 1, DType::int32), next_rank(b), tag_ub + 1);
      ADD_FAILURE() << "tag " << tag_ub + 1 << " above MPI_TAG_UB was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument) << e.what();
      EXPECT_NE(e.message().find(std::to_string(tag_ub)), std::string::npos) << e.what();
    }
  }
  // The largest tag MPI allows works (far above the Backend default of 32767).
  std::int32_t out = 1000 + b.rank(), in = -1;
  auto send = b.send_async(Buffer(&out, 1, DType::int32), next_rank(b), tag_ub);
  b.recv(Buffer(&in, 1, DType::int32), previous_rank(b), tag_ub);
  send->wait();
  EXPECT_EQ(in, 1000 + previous_rank(b));
  all_ranks_agree(!::testing::Test::HasFailure());
}

using test::ScopedEnv;

TEST(MpiConfig, CudaAwareFromEnvironment) {
  {
    ScopedEnv env("LOOM_MPI_CUDA_AWARE", "bogus");
    try {
      MpiConfig::from_env();
      ADD_FAILURE() << "LOOM_MPI_CUDA_AWARE=bogus was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
      EXPECT_NE(e.message().find("bogus"), std::string::npos) << e.what();
      EXPECT_NE(e.message().find("LOOM_MPI_CUDA_AWARE"), std::string::npos) << e.what();
    }
    expect_error(ErrorCode::invalid_argument,
                 "LOOM_MPI_CUDA_AWARE='bogus' is not valid (expected 0 or 1)",
                 [] { make_mpi_backend(); });
  }
  {
    ScopedEnv env("LOOM_MPI_CUDA_AWARE", "0");
    EXPECT_FALSE(MpiConfig::from_env().use_cuda_aware);
  }
  {
    ScopedEnv env("LOOM_MPI_CUDA_AWARE", "1");
    EXPECT_TRUE(MpiConfig::from_env().use_cuda_aware);
  }
  {
    ScopedEnv env("LOOM_MPI_CUDA_AWARE", nullptr);
    EXPECT_TRUE(MpiConfig::from_env().use_cuda_aware);
    EXPECT_TRUE(MpiConfig::from_env().require_thread_multiple);
  }
}

TEST(MpiBackend, CudaBuffersNeedCudaAwareMpiAndConfig) {
  // With a device visible, such buffers are staged through pinned memory (tests/gpu).
  if (cuda::device_count() > 0) GTEST_SKIP() << "a CUDA device is visible";
  MpiConfig config;
  config.use_cuda_aware = false;
  auto backend = make_mpi_backend(config);
  EXPECT_TRUE(backend->supports(Device::cpu()));
  EXPECT_FALSE(backend->supports(Device::cuda(0)));
  // A device buffer is refused before anything is sent (the pointer is never touched).
  float fake = 0;
  try {
    backend->allreduce(Buffer(&fake, 1, DType::float32, Device::cuda(0)), ReduceOp::sum);
    ADD_FAILURE() << "a cuda buffer was accepted with use_cuda_aware = false";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unsupported) << e.what();
  }
  all_ranks_agree(!::testing::Test::HasFailure());
}

// MPI_MIN/MPI_MAX would drop a NaN depending on operand order; loom's min/max propagate it.
TEST(MpiBackend, MinMaxPropagateNanOnEveryFloatType) {
  Backend& b = world();
  const int n = b.world_size(), me = b.rank();
  bool ok = true;
  for (ReduceOp op : {ReduceOp::min, ReduceOp::max}) {
    // Element 0: NaN on the last rank only; element 1: NaN on rank 0 only; element 2: rank.
    std::vector<float> f32{me == n - 1 ? NAN : float(me), me == 0 ? NAN : float(me), float(me)};
    std::vector<double> f64(f32.begin(), f32.end());
    std::vector<float16_t> f16;
    std::vector<bfloat16_t> bf16;
    for (float v : f32) {
      f16.push_back(to_float16(v));
      bf16.push_back(to_bfloat16(v));
    }
    b.allreduce(Buffer::of(std::span(f32)), op);
    b.allreduce(Buffer::of(std::span(f64)), op);
    b.allreduce(Buffer::of(std::span(f16)), op);
    b.allreduce(Buffer::of(std::span(bf16)), op);
    const float want = op == ReduceOp::min ? 0.0f : float(n - 1);
    const float got[4][3] = {{f32[0], f32[1], f32[2]},
                             {float(f64[0]), float(f64[1]), float(f64[2])},
                             {to_float(f16[0]), to_float(f16[1]), to_float(f16[2])},
                             {to_float(bf16[0]), to_float(bf16[1]), to_float(bf16[2])}};
    for (const auto& row : got) {
      EXPECT_TRUE(std::isnan(row[0])) << to_string(op);
      EXPECT_TRUE(std::isnan(row[1])) << to_string(op);
      EXPECT_EQ(row[2], want) << to_string(op);
      ok &= std::isnan(row[0]) && std::isnan(row[1]) && row[2] == want;
    }
  }
  all_ranks_agree(ok);
}

TEST(MpiBackend, AverageDividesOnlyWhereTheResultLands) {
  Backend& b = world();
  const int n = b.world_size(), me = b.rank();
  // reduce(avg) to the last rank: the other ranks' send buffers stay untouched.
  std::vector<float> send(4, float(2 * (me + 1))), recv(4, -1.0f);
  b.reduce(Buffer::of(std::span(send)), Buffer::of(std::span(recv)), ReduceOp::avg, n - 1);
  EXPECT_EQ(send, std::vector<float>(4, float(2 * (me + 1))));
  const float want = me == n - 1 ? float(n + 1) : -1.0f;
  EXPECT_EQ(recv, std::vector<float>(4, want));
  // allreduce(avg) on float16 through loom's own sum op.
  std::vector<float16_t> h(3, to_float16(float(2 * (me + 1))));
  b.allreduce(Buffer::of(std::span(h)), ReduceOp::avg);
  for (auto v : h) EXPECT_EQ(to_float(v), float(n + 1));
  all_ranks_agree(!::testing::Test::HasFailure());
}

TEST(MpiBackend, DroppingPendingWorkIsSafe) {
  Backend& b = world();
  const int n = b.world_size(), me = b.rank();
  // A dropped collective completes before its handle is gone (it waits), so the buffer holds
  // the result afterwards.
  auto data = inputs(me, 5000);
  b.allreduce_async(Buffer::of(std::span(data)), Buffer::of(std::span(data)), ReduceOp::sum)
      .reset();
  EXPECT_EQ(data, expected_sums(n, 5000));
  // A dropped receive is cancelled: the message it would have matched goes to the next one.
  std::int32_t lost = -1, got = -1, out = 77 + me;
  b.recv_async(Buffer(&lost, 1, DType::int32), previous_rank(b), 9).reset();
  b.barrier();  // no rank sends before every rank has dropped its receive
  auto send = b.send_async(Buffer(&out, 1, DType::int32), next_rank(b), 9);
  b.recv(Buffer(&got, 1, DType::int32), previous_rank(b), 9);
  send->wait();
  EXPECT_EQ(lost, -1);
  EXPECT_EQ(got, 77 + previous_rank(b));
  all_ranks_agree(!::testing::Test::HasFailure());
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
