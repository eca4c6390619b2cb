// Quick start: every collective and a point-to-point exchange on a few ranks, printing what
// each did. Under mpirun it uses the MPI backend; otherwise `--ranks N` threads (default 2).
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include <loom/backend.hpp>
#include <loom/error.hpp>
#include <loom/local.hpp>

namespace {

std::mutex print_mutex;

template <class T>
std::string show(const std::vector<T>& v) {
  std::ostringstream s;
  s << "[";
  for (std::size_t i = 0; i < v.size(); ++i) s << (i ? " " : "") << v[i];
  s << "]";
  return s.str();
}

// Each line is checked against the value computed by hand; a wrong value throws.
template <class T>
void report(loom::Backend& b, const std::string& what, const std::vector<T>& got,
            const std::vector<T>& want) {
  if (got != want)
    throw loom::Error(loom::ErrorCode::internal,
                      what + " gave " + show(got) + ", expected " + show(want));
  std::lock_guard lock(print_mutex);
  std::cout << "rank " << b.rank() << "/" << b.world_size() << " [" << b.name() << "] " << what
            << " -> " << show(got) << "  ok\n";
}

void demo(loom::Backend& b) {
  using loom::Buffer;
  using loom::ReduceOp;
  const int n = b.world_size(), r = b.rank();
  const int total = n * (n - 1) / 2;  // sum of ranks

  std::vector<float> grad{1.0f * r, 2.0f * r, 3.0f * r};
  b.allreduce(Buffer::of(std::span(grad)), ReduceOp::sum);
  report(b, "allreduce sum of rank*[1 2 3]", grad,
         std::vector<float>{1.0f * total, 2.0f * total, 3.0f * total});

  std::vector<double> avg{static_cast<double>(r)};
  b.allreduce(Buffer::of(std::span(avg)), ReduceOp::avg);
  report(b, "allreduce avg of rank", avg, std::vector<double>{static_cast<double>(total) / n});

  std::vector<std::int32_t> weights(4, r == 0 ? 42 : -1);
  b.broadcast(Buffer::of(std::span(weights)), 0);
  report(b, "broadcast from rank 0", weights, std::vector<std::int32_t>(4, 42));

  std::vector<std::int64_t> mine{r + 1}, all(n);
  b.allgather(Buffer::of(std::span(mine)), Buffer::of(std::span(all)));
  std::vector<std::int64_t> want_all(n);
  std::iota(want_all.begin(), want_all.end(), 1);
  report(b, "allgather of rank+1", all, want_all);

  std::vector<std::int32_t> shards(2 * n, 1), shard(2);
  b.reduce_scatter(Buffer::of(std::span(shards)), Buffer::of(std::span(shard)), ReduceOp::sum);
  report(b, "reduce_scatter sum of ones", shard, std::vector<std::int32_t>(2, n));

  std::vector<std::int32_t> peak{r * 10}, max_at_root{-1};
  b.reduce(Buffer::of(std::span(peak)), Buffer::of(std::span(max_at_root)), ReduceOp::max, n - 1);
  if (r == n - 1) report(b, "reduce max of rank*10 at the last rank", max_at_root, {(n - 1) * 10});

  std::vector<std::int32_t> out(n), in(n);
  for (int j = 0; j < n; ++j) out[j] = 100 * r + j;
  b.alltoall(Buffer::of(std::span(out)), Buffer::of(std::span(in)));
  std::vector<std::int32_t> want_in(n);
  for (int j = 0; j < n; ++j) want_in[j] = 100 * j + r;
  report(b, "alltoall of 100*rank+peer", in, want_in);

  std::vector<std::int32_t> token{r}, from_prev{-1};
  auto recv = b.recv_async(Buffer::of(std::span(from_prev)), (r + n - 1) % n, 1);
  b.send(Buffer::of(std::span(token)), (r + 1) % n, 1);
  recv->wait();
  report(b, "send/recv around the ring", from_prev, {(r + n - 1) % n});

  b.barrier();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    int ranks = 2;
    for (int i = 1; i < argc; ++i) {
      std::string arg = argv[i];
      if (arg == "--ranks" && i + 1 < argc) {
        ranks = std::atoi(argv[++i]);
      } else {
        std::cerr << "usage: loom-quickstart [--ranks N]   (under mpirun: one rank per process)\n";
        return 2;
      }
    }
    if (loom::launched_by_mpirun()) {
      auto backend = loom::create_backend();
      demo(*backend);
    } else {
      loom::LocalWorld::run(ranks, demo);
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "loom-quickstart: " << e.what() << "\n";
    return 1;
  }
}
