// loom-collectives: an nccl-tests-style benchmark of loom's collectives (see docs/algorithms.md).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>

#include "benchmark.hpp"
#include "harness.hpp"
#include "implementation.hpp"
#include "loom/config.hpp"
#include "loom/environment.hpp"
#include "loom/error.hpp"
#include "loom/gpu_direct.hpp"
#include "loom/local.hpp"
#include "options.hpp"
#include "report.hpp"

namespace loom::bench {
namespace {

constexpr int status_ok = 0;
constexpr int status_failed = 1;  // wrong results or a failure while running
constexpr int status_usage = 2;   // a bad command line

// Before the backend exists, whether this process is rank 0 of an mpirun job (or alone).
bool first_process() {
  return environment::launcher_rank().value_or(0) == 0;
}

bool wants(const Options& options, const std::string& algorithm) {
  return std::find(options.algorithms.begin(), options.algorithms.end(), algorithm) !=
         options.algorithms.end();
}

std::string build_config() {
  return std::string("loom ") + LOOM_VERSION + ", LOOM_HAVE_MPI=" + std::to_string(LOOM_HAVE_MPI) +
         " LOOM_HAVE_CUDA=" + std::to_string(LOOM_HAVE_CUDA) +
         " LOOM_HAVE_NCCL=" + std::to_string(LOOM_HAVE_NCCL);
}

void print_info(const Backend& backend) {
  std::string algorithms = "native";
  if (backend.has_algorithm_channel()) algorithms = algorithm_names() + ", auto";
  if (LOOM_HAVE_MPI && backend.name() == "mpi") algorithms += ", mpi-raw";
  std::printf("backend: %s\nranks: %d\nbuild: %s\nalgorithms available: %s\n",
              std::string(backend.name()).c_str(), backend.world_size(), build_config().c_str(),
              algorithms.c_str());
  // GPU-direct: CUDA-aware MPI, peer access, the peer-memory module.
  std::printf("%s", detect_gpu_direct().describe().c_str());
}

void print_preamble(const Options& options, const Backend& backend, Report& report) {
  std::string algorithms;
  for (const auto& name : options.algorithms) algorithms += (algorithms.empty() ? "" : ",") + name;
  report.comment("loom-collectives: backend " + std::string(backend.name()) + ", " +
                 std::to_string(backend.world_size()) + " ranks, " + build_config());
  report.comment("minBytes " + std::to_string(options.min_bytes) + " maxBytes " +
                 std::to_string(options.max_bytes) +
                 " step: " + std::to_string(options.step_factor) + "(factor) warmup iters: " +
                 std::to_string(options.warmups) + " iters: " + std::to_string(options.iterations) +
                 " validation: " + (options.check ? "1" : "0") + " algorithms: " + algorithms);
  if (backend.world_size() > 1)
    if (const std::string route = backend.route_to(1); !route.empty())
      report.comment("route from rank 0 to rank 1: " + route);
}

// One rank's whole run. Every rank returns the same status, except that only rank 0 can fail
// to write the JSON file.
int run_rank(const Options& options, Backend& backend, Harness& harness) {
  const bool printing = backend.rank() == 0;
  if (options.info) {
    if (printing) print_info(backend);
    return status_ok;
  }

  std::ofstream json;
  if (printing && !options.json_path.empty()) {
    json.open(options.json_path);
    if (!json)
      std::cerr << "loom-collectives: invalid value '" << options.json_path
                << "' for --json: the file cannot be opened for writing\n";
  }
  const bool json_failed = printing && !options.json_path.empty() && !json;
  if (harness.sum(json_failed ? 1 : 0) != 0) return status_usage;

  std::vector<std::unique_ptr<Implementation>> algorithms;
  for (const auto& name : options.algorithms) {
    if (name == "native") algorithms.push_back(make_native_implementation(backend));
    if (name == "auto") algorithms.push_back(make_auto_implementation(backend));
    if (name != "native" && name != "auto" && name != "mpi-raw")
      algorithms.push_back(make_loom_implementation(backend, parse_algorithm(name)));
#if LOOM_HAVE_MPI
    if (name == "mpi-raw") algorithms.push_back(make_mpi_raw_implementation());
#endif
  }

  Report report(stdout);
  if (printing) print_preamble(options, backend, report);
  const std::int64_t wrong =
      run_benchmark(options, backend, harness, algorithms, printing ? &report : nullptr);
  const int status = wrong == 0 ? status_ok : status_failed;
  if (!printing) return status;

  report.footer(options.check);
  if (json.is_open()) {
    json << to_json(report.rows());
    json.close();
    if (!json) {
      std::cerr << "loom-collectives: writing " << options.json_path << " failed\n";
      return status_failed;
    }
  }
  return status;
}

int run_local(Options options) {
  if (options.all_algorithms) std::erase(options.algorithms, "mpi-raw");
  if (wants(options, "mpi-raw"))
    throw UsageError(
        "-a mpi-raw needs the mpi backend (run under mpirun, or pass --backend mpi); this run "
        "uses the local backend");
  std::atomic<int> status{status_ok};
  LocalWorld::run(options.ranks.value_or(1), [&](Backend& backend) {
    auto harness = make_backend_harness(backend);
    const int result = run_rank(options, backend, *harness);
    if (backend.rank() == 0) status = result;
  });
  return status;
}

// The backend of a job whose ranks are processes: `name` (mpi or ucx), whose ranks `launcher`
// ("mpirun -np", "loom-launch -n") sets; --ranks, if given, must agree.
std::shared_ptr<Backend> job_backend(const std::string& name, const Options& options,
                                     const char* launcher) {
  std::shared_ptr<Backend> backend;
  try {
    backend = create_backend(name);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::unavailable)
      throw UsageError("--backend " + name + ": " + e.message());
    throw;
  }
  if (options.ranks && *options.ranks != backend->world_size())
    throw UsageError("invalid value '" + std::to_string(*options.ranks) + "' for --ranks: the " +
                     name + " backend has " + std::to_string(backend->world_size()) +
                     " ranks (set them with " + launcher + "; --ranks is for the local backend)");
  return backend;
}

int run_mpi(const Options& options) {
  std::shared_ptr<Backend> backend = job_backend("mpi", options, "mpirun -np");
#if LOOM_HAVE_MPI
  auto harness = make_mpi_harness();
  try {
    return run_rank(options, *backend, *harness);
  } catch (const std::exception& e) {
    // Other ranks may be waiting inside a collective for this one: end the whole job.
    std::cerr << "loom-collectives: rank " << backend->rank() << ": " << e.what() << "\n";
    abort_mpi_job(status_failed);
  }
#else
  return status_failed;  // create_backend("mpi") has thrown: unreachable
#endif
}

// Ranks started without mpirun (loom-launch), meeting through LOOM_STORE over UCX.
int run_ucx(Options options) {
  if (options.all_algorithms) std::erase(options.algorithms, "mpi-raw");
  if (wants(options, "mpi-raw"))
    throw UsageError("-a mpi-raw needs the mpi backend; this run uses ucx");
  std::shared_ptr<Backend> backend = job_backend("ucx", options, "loom-launch -n");
  auto harness = make_backend_harness(*backend);
  return run_rank(options, *backend, *harness);  // a failure here names this rank on the others
}

int run(const Options& options) {
  std::string backend = options.backend;
  if (backend.empty())
    backend = LOOM_HAVE_MPI && launched_by_mpirun()         ? "mpi"
              : environment::text("LOOM_STORE").has_value() ? "ucx"
                                                            : "local";
  if (backend == "ucx") return run_ucx(options);
  if (backend == "mpi") {
    if (!LOOM_HAVE_MPI)
      throw UsageError(
          "--backend mpi: this build of loom has no MPI (LOOM_HAVE_MPI=0); use --backend local");
    return run_mpi(options);
  }
  if (!LOOM_HAVE_MPI && wants(options, "mpi-raw") && !options.all_algorithms)
    throw UsageError("-a mpi-raw needs loom built with MPI (this build has LOOM_HAVE_MPI=0)");
  return run_local(options);
}

}  // namespace
}  // namespace loom::bench

int main(int argc, char** argv) {
  using namespace loom::bench;
  try {
    const Options options = parse_options(argc, argv);
    if (options.help) {
      if (first_process()) std::cout << usage();
      return status_ok;
    }
    return run(options);
  } catch (const UsageError& e) {
    if (first_process())
      std::cerr << "loom-collectives: " << e.what() << "\nRun loom-collectives --help for usage.\n";
    return status_usage;
  } catch (const std::exception& e) {
    std::cerr << "loom-collectives: " << e.what() << "\n";
    return status_failed;
  }
}
