// loom-bench-progress-cpu: how much CPU the thread that completes communication takes, idle
// (a receive waiting for a message that comes seconds later) and busy (allreduces back to back),
// on the backend create_backend() makes: mpi under mpirun, ucx under loom-launch. On ucx it also
// measures the alternative to the progress engine's back-off: a thread that sleeps in UCX's
// wakeup (Transport::wait_for_event: ucp_worker_arm, then poll on the worker's fd) while a
// receive waits. Prints CPU seconds per second of each thread (1.0 = a whole core), from
// /proc/self/task/<tid>/stat.
//   mpirun -np 2 loom-bench-progress-cpu --seconds 3
//   loom-launch -n 2 -- loom-bench-progress-cpu --seconds 3
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "loom/backend.hpp"
#include "loom/error.hpp"
#include "loom/progress_engine.hpp"
#include "loom/store.hpp"
#include "ucx_transport.hpp"

namespace {

using Clock = std::chrono::steady_clock;

// CPU seconds (user + system) thread `tid` of this process has used.
double thread_cpu_s(long tid) {
  std::ifstream stat("/proc/self/task/" + std::to_string(tid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  std::istringstream fields(text.substr(text.rfind(')') + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i)
    if (i == 14 || i == 15) ticks += std::stod(field);
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

long this_thread_id() {
  return static_cast<long>(syscall(SYS_gettid));
}

struct Sample {
  double cpu_per_s = 0;
  double calls_per_s = 0;
};

// Rank 0 watches a receive that rank 1 answers after `seconds`: the engine's CPU while waiting.
Sample engine_idle(loom::Backend& backend, double seconds) {
  std::vector<float> data(1024);
  loom::Buffer buffer(data.data(), data.size(), loom::DType::float32);
  if (backend.rank() == 1) {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    backend.send(buffer, 0, 5);
    return {};
  }
  if (backend.rank() != 0) return {};
  loom::ProgressEngine engine;
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  const double before = thread_cpu_s(engine.thread_id());
  const auto start = Clock::now();
  engine.watch(backend.recv_async(buffer, 1, 5), [&](std::exception_ptr) {
    std::lock_guard lock(mutex);
    done = true;
    done_cv.notify_one();
  });
  std::unique_lock lock(mutex);
  done_cv.wait(lock, [&] { return done; });
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  return {(thread_cpu_s(engine.thread_id()) - before) / elapsed, 0};
}

// Allreduces of `bytes` back to back for `seconds`, each handed to the engine.
Sample engine_busy(loom::Backend& backend, double seconds, std::size_t bytes) {
  std::vector<float> data(bytes / sizeof(float), 1.0f);
  loom::Buffer buffer(data.data(), data.size(), loom::DType::float32);
  loom::ProgressEngine engine;
  std::mutex mutex;
  std::condition_variable done_cv;
  // Every rank runs the same number of calls: rank 0 decides when to stop by count.
  std::int64_t calls = 0;
  const double before = thread_cpu_s(engine.thread_id());
  const auto start = Clock::now();
  for (;;) {
    std::int64_t stop = std::chrono::duration<double>(Clock::now() - start).count() > seconds;
    backend.broadcast(loom::Buffer(&stop, 1, loom::DType::int64), 0);
    if (stop != 0) break;
    bool done = false;
    engine.watch(backend.allreduce_async(buffer, buffer, loom::ReduceOp::max),
                 [&](std::exception_ptr) {
                   std::lock_guard lock(mutex);
                   done = true;
                   done_cv.notify_one();
                 });
    std::unique_lock lock(mutex);
    done_cv.wait(lock, [&] { return done; });
    ++calls;
  }
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  return {(thread_cpu_s(engine.thread_id()) - before) / elapsed, calls / elapsed};
}

// ucx only: the same idle receive on a transport of its own, waited for by a thread that sleeps
// in UCX's wakeup between tests.
Sample arm_idle(double seconds) {
  auto env = loom::store_from_environment();
  if (!env) return {};
  loom::Rendezvous rendezvous(env->store, env->rank, env->world_size, "progress-cpu-arm",
                              std::chrono::seconds(60));
  loom::ucx::Transport transport(rendezvous);
  std::vector<float> data(1024);
  Sample sample;
  if (transport.rank() == 1) {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    auto send = transport.send(data.data(), data.size() * sizeof(float), 0, 5);
    while (!send->test()) transport.wait_for_event(std::chrono::milliseconds(100));
  } else if (transport.rank() == 0) {
    auto recv = transport.recv(data.data(), data.size() * sizeof(float), 1, 5);
    std::thread waiter([&] {
      const long tid = this_thread_id();
      const double before = thread_cpu_s(tid);
      const auto start = Clock::now();
      while (!recv->test()) transport.wait_for_event(std::chrono::milliseconds(100));
      const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
      sample.cpu_per_s = (thread_cpu_s(tid) - before) / elapsed;
    });
    waiter.join();
  }
  rendezvous.barrier();
  return sample;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 3;
  std::size_t bytes = std::size_t{1} << 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--seconds") seconds = std::atof(argv[i + 1]);
    if (flag == "--bytes") bytes = std::strtoull(argv[i + 1], nullptr, 10);
  }
  try {
    auto backend = loom::create_backend();
    const Sample idle = engine_idle(*backend, seconds);
    backend->barrier();
    const Sample busy = engine_busy(*backend, seconds, bytes);
    backend->barrier();
    Sample arm;
    if (backend->name() == "ucx") arm = arm_idle(seconds);
    if (backend->rank() == 0) {
      std::printf("backend %s, %d ranks: progress thread CPU per second\n",
                  std::string(backend->name()).c_str(), backend->world_size());
      std::printf("  idle (a receive waiting %.1f s), engine back-off: %.4f\n", seconds,
                  idle.cpu_per_s);
      std::printf("  busy (allreduce of %zu B back to back, %.0f/s), engine: %.4f\n", bytes,
                  busy.calls_per_s, busy.cpu_per_s);
      if (backend->name() == "ucx")
        std::printf("  idle, UCX wakeup (ucp_worker_arm + poll): %.4f\n", arm.cpu_per_s);
    }
    return 0;
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "loom-bench-progress-cpu: %s\n", e.what());
    return 1;
  }
}
