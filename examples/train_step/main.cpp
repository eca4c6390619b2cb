// train_step: trains a data-parallel MLP with loom for a few steps and reports loss, step time
// and overlap; writes the step's DOT graph and Chrome trace. 2 local ranks as threads, or one
// rank per process under mpirun:
//   ./loom-train-step --steps 20        mpirun -np 2 ./loom-train-step --dot step.dot
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <mutex>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <malloc.h>
#include <unistd.h>

#include <boost/program_options.hpp>

#include "loom/error.hpp"
#include "loom/local.hpp"
#include "loom/output_file.hpp"
#include "loom/overlap_metrics.hpp"
#include "loom/streaming_quantile.hpp"
#include "train_options.hpp"

namespace po = boost::program_options;
using namespace loom;
using namespace loom::examples;

namespace {

struct Flags {
  TrainFlags train;
  int ranks = 2;
  int steps = 10;
  std::string mode = "loom";
  std::string dot = "train_step.dot";
  std::string trace = "train_step_trace.json";
  bool rebuild = false;
  int print_every = 1;
  int memory_after = 0;
};

// Resident memory of this process (bytes), from /proc/self/statm; 0 where it cannot be read.
// Freed heap memory goes back to the system first (malloc_trim), so what is counted is what the
// program holds, not what glibc's per-thread arenas keep cached after a busy moment.
std::size_t resident_bytes() {
  ::malloc_trim(0);
  std::size_t pages = 0, resident = 0;
  if (std::FILE* statm = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(statm, "%zu %zu", &pages, &resident) != 2) resident = 0;
    std::fclose(statm);
  }
  return resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

// Heap bytes the program holds (every arena's allocated chunks plus mmapped blocks), the
// measure of what it records: resident memory also moves with how glibc's per-thread arenas
// happen to be fragmented when the machine is loaded and threads migrate between them.
std::size_t heap_bytes() {
  const struct mallinfo2 info = ::mallinfo2();
  return info.uordblks + info.hblkhd;
}

struct MemorySample {
  std::size_t heap = 0;
  std::size_t resident = 0;
};

MemorySample sample_memory() {
  return {heap_bytes(), resident_bytes()};
}

// "trace.json" -> "trace.rank1.json" with several ranks; rank -1: "trace.rank*.json".
std::string rank_path(const std::string& path, int rank, int world) {
  if (world == 1) return path;
  const std::string suffix = ".rank" + (rank < 0 ? std::string("*") : std::to_string(rank));
  const auto dot = path.rfind('.');
  const auto slash = path.rfind('/');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return path + suffix;
  return path.substr(0, dot) + suffix + path.substr(dot);
}

int train_on(Backend& backend, const Flags& flags) {
  TrainConfig config = flags.train.config;
  config.mode = parse_overlap_mode(flags.mode);
  config.executor.profile = true;
  TrainStep step(backend, config);
  const bool root = backend.rank() == 0;
  if (root)
    std::printf(
        "# train_step: %d ranks (%s), MLP %d -> %d x %d -> %d, batch %d per rank, "
        "%zu parameters in %zu buckets, mode %s\n",
        backend.world_size(), std::string(backend.name()).c_str(), config.shape.input,
        config.shape.depth, config.shape.width, config.shape.output, config.shape.batch,
        step.parameters().size(), step.bucketer().buckets().size(), flags.mode.c_str());
  // Running medians: fixed memory however many steps run.
  StreamingQuantile step_ms, efficiency;
  MemorySample memory_start;
  for (int s = 0; s < flags.steps; ++s) {
    const auto start = std::chrono::steady_clock::now();
    step.run();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    const auto metrics = measure_overlap(step.executor().last_run());
    float loss = step.loss();
    backend.allreduce(Buffer(&loss, 1, DType::float32), ReduceOp::avg);
    if (s > 0) {  // the first step pays for first-touch page faults and pool misses
      step_ms.add(ms);
      efficiency.add(metrics.overlap_efficiency);
    }
    if (flags.memory_after > 0 && s + 1 == flags.memory_after) memory_start = sample_memory();
    if (root && (s % flags.print_every == 0 || s + 1 == flags.steps))
      std::printf(
          "step %3d  loss %.6f  step %.3f ms  compute %.3f ms  comm %.3f ms  overlap %.2f\n", s,
          loss, ms, metrics.compute_ms, metrics.comm_ms, metrics.overlap_efficiency);
    if (s == 0 && flags.rebuild) {
      step.rebuild_buckets();
      if (root)
        std::printf("# buckets rebuilt from rank 0's ready order: %zu buckets\n",
                    step.bucketer().buckets().size());
    }
  }
  // Before the files and reports below, which allocate once.
  const MemorySample memory_end = flags.memory_after > 0 ? sample_memory() : MemorySample{};
  // Data parallelism keeps every rank's weights identical: every rank compares its weights with
  // rank 0's bit for bit (rank 0's bytes broadcast), and the ranks add up how many of each
  // rank's parameters differ. A sum of the weights could agree where the weights do not; it is
  // printed only as a fingerprint of the run.
  const std::vector<float> params = step.parameters();
  std::vector<float> rank0 = params;
  backend.broadcast(Buffer(rank0.data(), rank0.size() * sizeof(float), DType::uint8), 0);
  std::vector<std::int64_t> differing(static_cast<std::size_t>(backend.world_size()), 0);
  for (std::size_t i = 0; i < params.size(); ++i)
    if (std::memcmp(&params[i], &rank0[i], sizeof(float)) != 0) ++differing[backend.rank()];
  backend.allreduce(Buffer::of(std::span(differing)), ReduceOp::sum);
  const bool identical =
      std::all_of(differing.begin(), differing.end(), [](std::int64_t n) { return n == 0; });
  double sum = 0;
  for (float p : params) sum += p;
  // Every rank writes its trace (".rank<r>" before the extension with several ranks), so that
  // tools/loom-trace-merge can put the whole job on one timeline.
  const std::string trace = rank_path(flags.trace, backend.rank(), backend.world_size());
  step.executor().write_trace(trace);
  if (root) {
    const auto dot_start = std::chrono::steady_clock::now();
    {
      std::ofstream dot = loom::open_output_file(flags.dot, "DOT file");
      step.executor().dump_dot(dot);
      loom::close_output_file(dot, flags.dot, "DOT file");
    }
    const double dot_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - dot_start)
            .count();
    std::printf("# the last step on rank 0: why each collective was or wasn't hidden\n");
    std::ostringstream report;
    print_communication_report(
        report, explain_communication(step.executor().last_run(), cores_per_rank(backend)));
    std::fputs(report.str().c_str(), stdout);
    std::printf("median step %.3f ms, median overlap efficiency %.2f (steps 1..%d)\n",
                step_ms.median(), efficiency.median(), flags.steps - 1);
    if (flags.memory_after > 0 && flags.memory_after < flags.steps) {
      const double steps = flags.steps - flags.memory_after;
      const auto report = [&](const char* what, std::size_t start, std::size_t end) {
        std::printf("%s %zu bytes after step %d, %zu after step %d: %+.3f bytes per step\n", what,
                    start, flags.memory_after - 1, end, flags.steps - 1,
                    (static_cast<double>(end) - static_cast<double>(start)) / steps);
      };
      report("heap in use", memory_start.heap, memory_end.heap);
      report("resident memory", memory_start.resident, memory_end.resident);
    }
    if (identical) {
      std::printf("weights identical on every rank (checksum %.9g)\n", sum);
    } else {
      std::string which;
      for (std::size_t r = 1; r < differing.size(); ++r)
        if (differing[r] != 0)
          which += (which.empty() ? "" : ", ") + std::string("rank ") + std::to_string(r) + " (" +
                   std::to_string(differing[r]) + " of " + std::to_string(params.size()) +
                   " parameters)";
      std::printf("weights DIFFER from rank 0's, bit for bit, on %s\n", which.c_str());
    }
    std::printf(
        "wrote %s (%zu nodes%s, %.1f ms; dot -Tpng %s -o step.png) and %s (open in "
        "ui.perfetto.dev)\n",
        flags.dot.c_str(), step.executor().size(),
        step.executor().size() > DotOptions{}.summary_above ? ", summary" : "", dot_ms,
        flags.dot.c_str(), trace.c_str());
    if (backend.world_size() > 1)
      std::printf("one timeline of every rank: loom-trace-merge -o job.json %s\n",
                  rank_path(flags.trace, -1, backend.world_size()).c_str());
  }
  return identical ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  po::options_description options("loom-train-step options");
  options.add_options()("help,h", "this help")(
      "ranks", po::value(&flags.ranks)->default_value(flags.ranks),
      "local ranks (threads) when not under mpirun or loom-launch")(
      "steps", po::value(&flags.steps)->default_value(flags.steps), "training steps")(
      "mode", po::value(&flags.mode)->default_value(flags.mode), "sequential, ddp or loom")(
      "rebuild", po::bool_switch(&flags.rebuild),
      "rebuild buckets after step 0 from the observed ready order")(
      "dot", po::value(&flags.dot)->default_value(flags.dot), "DOT file of the step (rank 0)")(
      "trace", po::value(&flags.trace)->default_value(flags.trace),
      "Chrome trace of the last step (\".rank<r>\" inserted with several ranks)")(
      "print-every", po::value(&flags.print_every)->default_value(flags.print_every),
      "print every N-th step's line (and the last)")(
      "memory-after", po::value(&flags.memory_after)->default_value(flags.memory_after),
      "report the process's resident memory growth per step from step N to the end (0: off)");
  add_train_options(options, flags.train);
  try {
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, options), vm);
    if (vm.count("help")) {
      std::cout << options << "\n";
      return 0;
    }
    po::notify(vm);
    apply_train_options(flags.train);
    parse_overlap_mode(flags.mode);
    if (flags.steps < 1 || flags.ranks < 1 || flags.print_every < 1)
      throw Error(ErrorCode::invalid_argument, "--steps, --ranks and --print-every must be >= 1");
    if (flags.memory_after < 0)
      throw Error(ErrorCode::invalid_argument, "--memory-after must be >= 0");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom-train-step: %s\n", e.what());
    return 2;
  }
  try {
    // Under mpirun (mpi) or loom-launch (ucx, through LOOM_STORE): one rank per process.
    if (launched_by_mpirun() || std::getenv("LOOM_STORE") != nullptr)
      return train_on(*create_backend(), flags);
    std::atomic<int> failed{0};
    LocalWorld::run(flags.ranks, [&](Backend& backend) { failed += train_on(backend, flags); });
    return failed == 0 ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "loom-train-step: %s\n", e.what());
    return 1;
  }
}
