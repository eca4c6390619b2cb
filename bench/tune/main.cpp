// loom-tune: measures alpha and beta (ping-pong on loom's algorithm channel; on a job spanning
// nodes, inside a node and between two nodes' leaders: the two levels), gamma (the
// reduction kernel) and a line per native collective, and with --full times every candidate
// at power-of-two sizes; writes a tuning file that LOOM_TUNING_FILE points the selector at.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "loom/algorithm.hpp"
#include "loom/algorithm_selector.hpp"
#include "loom/candidate_timing.hpp"
#include "loom/error.hpp"
#include "loom/kernels/reduce.hpp"
#include "loom/local.hpp"
#include "loom/output_file.hpp"
#include "loom/tuning.hpp"

namespace {

using namespace loom;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string output = "loom.tuning";
  bool full = false;
  std::size_t min_bytes = 8;
  std::size_t max_bytes = std::size_t{64} << 20;
  std::vector<Collective> collectives{Collective::allreduce, Collective::allgather,
                                      Collective::reduce_scatter, Collective::broadcast,
                                      Collective::reduce};
  std::string backend;
  int ranks = 2;
  int ranks_per_node = 0;  // local backend: 0 = one node
  double seconds_per_point = 0.05;
  int rounds = 7;
  TimingForm form = TimingForm::blocking;
};

const char* usage_text =
    "usage: loom-tune [-o FILE] [--full] [-b MIN] [-e MAX] [-o FILE] [--collectives LIST]\n"
    "                 [--backend local|mpi] [--ranks N] [--ranks-per-node K] [--time SECONDS]\n"
    "                 [--rounds N] [--async]\n"
    "  -o FILE          tuning file to write (loom.tuning); point LOOM_TUNING_FILE at it\n"
    "  --full           also time every candidate of every collective at power-of-two sizes\n"
    "  -b, -e           smallest and largest size for --full (8, 64M; K, M, G = 1024^n)\n"
    "  --collectives    comma list (allreduce,allgather,reduce_scatter,broadcast,reduce)\n"
    "  --backend        local or mpi (mpi under mpirun, else local)\n"
    "  --ranks N        ranks of the local backend (2)\n"
    "  --ranks-per-node K  the local backend's ranks placed K per node (default: one node);\n"
    "                   on several nodes, some holding two ranks, alpha and beta are measured\n"
    "                   inside a node and between nodes (under mpirun: the nodes MPI reports)\n"
    "  --time SECONDS   time spent per measured point (0.05), split over the rounds\n"
    "  --rounds N       --full times every candidate at every size once per round, N rounds\n"
    "                   (7) spread over the run, and keeps each one's median and quartiles,\n"
    "                   so that a burst of load hits all candidates alike\n"
    "  --async          time the asynchronous form (start, then wait), as the executor, the\n"
    "                   torch process group and the calibration (LOOM_CALIBRATION) run\n"
    "                   collectives; default: the blocking form (run_collective), which differs\n"
    "                   only for native (the backend's blocking call, e.g. MPI_Allreduce); each\n"
    "                   measured line ends with the form\n"
    "Run it with the rank count and transport the job will use: mpirun -np 4 loom-tune --full\n";

Options parse(int argc, char** argv) {
  Options o;
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc)
      throw Error(ErrorCode::invalid_argument, std::string(argv[i]) + " needs a value");
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::cout << usage_text;
      std::exit(0);
    } else if (a == "-o") {
      o.output = value(i);
    } else if (a == "--full") {
      o.full = true;
    } else if (a == "-b") {
      o.min_bytes = parse_byte_size(value(i));
    } else if (a == "-e") {
      o.max_bytes = parse_byte_size(value(i));
    } else if (a == "--backend") {
      o.backend = value(i);
      if (o.backend != "local" && o.backend != "mpi")
        throw Error(ErrorCode::invalid_argument,
                    "--backend '" + o.backend + "': expected local or mpi");
    } else if (a == "--ranks") {
      const std::string v = value(i);
      o.ranks = std::atoi(v.c_str());
      if (o.ranks < 1 || o.ranks > 64)
        throw Error(ErrorCode::invalid_argument, "--ranks '" + v + "': expected 1..64");
    } else if (a == "--ranks-per-node") {
      const std::string v = value(i);
      o.ranks_per_node = std::atoi(v.c_str());
      if (o.ranks_per_node < 1 || o.ranks_per_node > 64)
        throw Error(ErrorCode::invalid_argument, "--ranks-per-node '" + v + "': expected 1..64");
    } else if (a == "--time") {
      const std::string v = value(i);
      o.seconds_per_point = std::atof(v.c_str());
      if (!(o.seconds_per_point > 0))
        throw Error(ErrorCode::invalid_argument, "--time '" + v + "': expected seconds > 0");
    } else if (a == "--rounds") {
      const std::string v = value(i);
      o.rounds = std::atoi(v.c_str());
      if (o.rounds < 1 || o.rounds > 1000)
        throw Error(ErrorCode::invalid_argument, "--rounds '" + v + "': expected 1..1000");
    } else if (a == "--async") {
      o.form = TimingForm::asynchronous;
    } else if (a == "--collectives") {
      o.collectives.clear();
      std::string list = value(i);
      for (std::size_t start = 0; start <= list.size();) {
        const std::size_t comma = std::min(list.find(',', start), list.size());
        o.collectives.push_back(parse_collective(list.substr(start, comma - start)));
        start = comma + 1;
      }
    } else {
      throw Error(ErrorCode::invalid_argument, "unknown argument '" + a + "'\n" + usage_text);
    }
  }
  if (o.min_bytes == 0 || o.min_bytes > o.max_bytes)
    throw Error(ErrorCode::invalid_argument, "-b must be at least 1 and at most -e");
  return o;
}

// Least-squares fit of t = a + b x (a, b clamped at 0).
std::pair<double, double> fit_line(const std::vector<double>& x, const std::vector<double>& t) {
  const double n = static_cast<double>(x.size());
  double sx = 0, st = 0, sxx = 0, sxt = 0;
  for (std::size_t i = 0; i < x.size(); ++i)
    sx += x[i], st += t[i], sxx += x[i] * x[i], sxt += x[i] * t[i];
  const double slope = (n * sxt - sx * st) / std::max(n * sxx - sx * sx, 1e-30);
  const double intercept = (st - slope * sx) / n;
  return {std::max(intercept, 0.0), std::max(slope, 0.0)};
}

// Runs `once` for about `budget` seconds in 5 batches (the same counts on every rank) and
// returns the median batch's average of the slowest rank: on a shared machine one preempted
// batch must not decide the tuning.
double time_collectively(Backend& b, double budget, const std::function<void()>& once) {
  once();  // warm-up (and first touch of scratch memory)
  b.barrier();
  auto start = Clock::now();
  once();
  const double first =
      max_over_ranks(b, std::chrono::duration<double>(Clock::now() - start).count());
  constexpr int batches = 5;
  const int iterations =
      static_cast<int>(std::clamp(budget / batches / std::max(first, 1e-7), 1.0, 100.0));
  std::vector<double> averages;
  for (int k = 0; k < batches; ++k) {
    b.barrier();
    start = Clock::now();
    for (int i = 0; i < iterations; ++i) once();
    const double mine = std::chrono::duration<double>(Clock::now() - start).count() / iterations;
    averages.push_back(max_over_ranks(b, mine));
  }
  std::sort(averages.begin(), averages.end());
  return averages[batches / 2];
}

// One call of `algorithm` in the form the tuning is for (see --async).
void perform(Backend& b, const Options& o, Algorithm algorithm, const CollectiveArgs& args) {
  if (o.form == TimingForm::asynchronous)
    start_collective(b, algorithm, args)->wait();
  else
    run_collective(b, algorithm, args);
}

class Progress {
 public:
  Progress(bool printing, int total) : _printing(printing), _total(total) {}
  // On a terminal one line redrawn per step; in a log, a line per tenth of the work.
  void step(const std::string& what) {
    ++_done;
    if (!_printing) return;
    if (_terminal) {
      std::fprintf(stderr, "\rloom-tune: [%3d/%3d] %-60s", _done, _total, what.c_str());
    } else if (_done * 10 / _total != (_done - 1) * 10 / _total || _done == 1) {
      std::fprintf(stderr, "loom-tune: [%3d/%3d] %s\n", _done, _total, what.c_str());
    }
  }
  void finish() {
    if (_printing && _terminal) std::fprintf(stderr, "\n");
  }

 private:
  bool _printing;
  bool _terminal = ::isatty(2) != 0;
  int _total;
  int _done = 0;
};

constexpr int ping_pong_points = 8;  // 8 B .. 16 MiB, x8

// alpha, beta: half the round trip of ranks `from` <-> `to` on the algorithm channel (`level`
// names the pair in the progress lines).
CostParameters measure_point_to_point(Backend& b, const Options& o, Progress& progress, int from,
                                      int to, const std::string& level) {
  std::vector<double> sizes, times;
  std::vector<std::byte> buffer(std::size_t{16} << 20);
  for (std::size_t bytes = 8, k = 0; k < ping_pong_points; bytes *= 8, ++k) {
    const Buffer message(buffer.data(), bytes, DType::uint8);
    const double t = time_collectively(b, o.seconds_per_point, [&] {
      if (b.rank() == from) {
        b.algorithm_send_async(message, to, 1)->wait();
        b.algorithm_recv_async(message, to, 1)->wait();
      } else if (b.rank() == to) {
        b.algorithm_recv_async(message, from, 1)->wait();
        b.algorithm_send_async(message, from, 1)->wait();
      }
    });
    sizes.push_back(static_cast<double>(bytes));
    times.push_back(t / 2);
    progress.step("ping-pong " + level + " " + std::to_string(bytes) + " B");
  }
  CostParameters c;
  std::tie(c.alpha_s, c.beta_s_per_byte) = fit_line(sizes, times);
  // The intercept of a fit dominated by large messages is imprecise: alpha is the small one.
  c.alpha_s = times.front();
  return c;
}

// gamma: the reduction kernel's time per byte (float32 sum, the common case).
double measure_reduction(Backend& b, const Options& o, Progress& progress) {
  std::vector<float> a(std::size_t{4} << 20, 1.0f), x(a.size(), 2.0f);
  const double t = time_collectively(b, o.seconds_per_point, [&] {
    kernels::reduce(a.data(), x.data(), a.size(), DType::float32, ReduceOp::sum);
  });
  progress.step("reduction kernel");
  return t / static_cast<double>(a.size() * sizeof(float));
}

int run(Backend& b, const Options& o) {
  const bool printing = b.rank() == 0;
  if (b.world_size() < 2)
    throw Error(ErrorCode::invalid_argument,
                "loom-tune needs at least 2 ranks (mpirun -np N, or --ranks N with the local "
                "backend)");
  const std::vector<std::size_t> native_sizes{1 << 10, 64 << 10, 1 << 20, 8 << 20};
  std::vector<std::size_t> full_sizes;
  for (std::size_t s = o.min_bytes; s <= o.max_bytes; s *= 2) full_sizes.push_back(s);
  // The two levels: ranks sharing a node (the first node holding two), and the leaders of
  // nodes 0 and 1 when the job spans nodes and some node holds two ranks. One level otherwise:
  // ranks 0 and 1, wherever they run.
  const Topology& topology = b.topology();
  std::pair<int, int> intra{0, 1};
  bool two_levels = false;
  for (int node = 0; node < topology.node_count(); ++node)
    if (topology.ranks_of_node(node).size() >= 2) {
      intra = {topology.ranks_of_node(node)[0], topology.ranks_of_node(node)[1]};
      two_levels = topology.node_count() >= 2;
      break;
    }
  int total = ping_pong_points * (two_levels ? 2 : 1) + 1 +
              static_cast<int>(o.collectives.size() * native_sizes.size());
  if (o.full) total += o.rounds;
  Progress progress(printing, total);

  TuningParameters t;
  t.backend = std::string(b.name());
  t.cost = measure_point_to_point(
      b, o, progress, intra.first, intra.second,
      two_levels ? "inside node " + std::to_string(topology.node_of(intra.first)) : "");
  if (two_levels)
    t.inter_node = measure_point_to_point(b, o, progress, topology.leader_of_node(0),
                                          topology.leader_of_node(1), "between nodes 0 and 1");
  t.cost.gamma_s_per_byte = measure_reduction(b, o, progress);

  std::vector<float> send, recv;
  for (Collective c : o.collectives) {
    std::vector<double> x, y;
    for (std::size_t bytes : native_sizes) {
      const CollectiveArgs args = benchmark_args(c, bytes, b.world_size(), send, recv);
      const double seconds = time_collectively(b, o.seconds_per_point,
                                               [&] { perform(b, o, Algorithm::native, args); });
      x.push_back(static_cast<double>(selection_bytes(args)));
      y.push_back(seconds);
      progress.step("native " + std::string(to_string(c)) + " " + std::to_string(bytes) + " B");
    }
    // The slope from the fit; the intercept from the smallest size, which the large sizes
    // would swamp in a least-squares intercept.
    const double beta = fit_line(x, y).second;
    t.native.push_back({c, b.world_size(), std::max(y.front() - beta * x.front(), 0.0), beta});
  }

  if (o.full) {
    CandidateTimingOptions timing;
    timing.collectives = o.collectives;
    timing.sizes = full_sizes;
    timing.rounds = o.rounds;
    timing.seconds_per_point = o.seconds_per_point;
    timing.forms = {o.form};
    t.measured = time_candidates(b, timing, [&](int round) {
      progress.step("round " + std::to_string(round) + " of " + std::to_string(o.rounds));
    });
  }
  progress.finish();
  if (!printing) return 0;
  std::ofstream out = open_output_file(o.output, "tuning file");
  out << format_tuning_file(t);
  close_output_file(out, o.output, "tuning file");
  if (t.inter_node)
    std::fprintf(stderr,
                 "loom-tune: %s; between nodes: alpha %.3g us, beta %.3g ns/B (%.2f GB/s)\n",
                 topology.describe().c_str(), t.inter_node->alpha_s * 1e6,
                 t.inter_node->beta_s_per_byte * 1e9,
                 t.inter_node->beta_s_per_byte > 0 ? 1e-9 / t.inter_node->beta_s_per_byte : 0.0);
  std::fprintf(stderr,
               "loom-tune: %s backend, %d ranks: alpha %.3g us, beta %.3g ns/B (%.2f GB/s), gamma "
               "%.3g ns/B; %zu native fits, %zu measurements -> %s\n"
               "loom-tune: export LOOM_TUNING_FILE=%s\n",
               t.backend.c_str(), b.world_size(), t.cost.alpha_s * 1e6,
               t.cost.beta_s_per_byte * 1e9,
               t.cost.beta_s_per_byte > 0 ? 1e-9 / t.cost.beta_s_per_byte : 0.0,
               t.cost.gamma_s_per_byte * 1e9, t.native.size(), t.measured.size(), o.output.c_str(),
               o.output.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    std::string backend = o.backend;
    if (backend.empty()) backend = launched_by_mpirun() ? "mpi" : "local";
    if (backend == "mpi") {
      if (o.ranks_per_node > 0)
        throw Error(ErrorCode::invalid_argument,
                    "--ranks-per-node places the local backend's ranks; under mpirun the nodes "
                    "are those MPI reports (MPI_Comm_split_type)");
      auto b = create_backend("mpi");
      return run(*b, o);
    }
    std::atomic<int> status{0};
    const Topology topology = o.ranks_per_node > 0 ? Topology::blocks(o.ranks, o.ranks_per_node)
                                                   : Topology::single_node(o.ranks);
    LocalWorld::run(topology, [&](Backend& b) {
      const int s = run(b, o);
      if (b.rank() == 0) status = s;
    });
    return status;
  } catch (const std::exception& e) {
    std::cerr << "loom-tune: " << e.what() << "\n";
    return 2;
  }
}
