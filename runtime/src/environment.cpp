// Environment: the LOOM_* variables and the parsers every layer uses to read them.
#include "loom/environment.hpp"

#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "loom/error.hpp"

namespace loom::environment {
namespace {

constexpr std::array<Variable, 23> all_variables{{
    {"LOOM_BACKEND", "the backend create_backend() makes",
     "mpi under mpirun, ucx where LOOM_STORE is set, else local", "local, mpi, nccl, ucx"},
    {"LOOM_TIMEOUT_S",
     "watchdog of every wait on another rank (executor, every blocking backend call, compile's "
     "cross-rank check, nccl backend): an operation not done after this many seconds fails with "
     "ErrorCode::timeout naming the ranks that did not arrive; a blocking MPI call, which cannot "
     "be abandoned, prints that error and ends the process with status 124 "
     "(Backend::set_timeout per backend)",
     "300", "decimal seconds >= 0; 0 disables"},
    {"LOOM_TORCH_CUDA_BUCKETS",
     "where `parallelize` buckets a CUDA model: `device` (its GPU's memory, loom's CUDA kernels) "
     "or `host` (staged through host buckets) (docs/parallelize.md)",
     "auto: device for an unsharded model on one GPU whose group can move device memory, else host",
     "auto, host, device"},
    {"LOOM_TORCH_CUDA_PATH",
     "how a loom torch group moves CUDA tensors: `nccl` (one rank per GPU) or `staged` through "
     "pinned host memory on the mpi or ucx transport (docs/torch.md)",
     "auto: nccl where built and not refused, else staged", "auto, nccl, staged"},
    {"LOOM_TORCH_UNSAFE_SKIP",
     "test switch: turns off loom_torch's stream wait or input hold so that "
     "tests/torch/test_cuda.py proves each matters; never in a real job",
     "unset", "stream_wait, input_hold (comma-separated)"},
    {"LOOM_TRACE",
     "file the executor writes its Chrome-trace JSON timeline to after every run "
     "(\".rank<r>\" inserted with several ranks)",
     "unset: no trace", "a writable path"},
    {"LOOM_PROGRESS_PRIORITY",
     "how the progress thread that completes communication (executor, torch process group) is "
     "scheduled against compute: realtime is SCHED_FIFO 1, short_slice a 100 us EEVDF slice "
     "(Linux 6.12+, no privilege); an explicit choice the process may not have is an "
     "invalid_argument error",
     "automatic: realtime where permitted, else short_slice, else normal; normal when the "
     "launcher puts more ranks on the host than it has CPUs, and when as many beside compute "
     "outside loom's workers (an autograd engine: docs/backends.md)",
     "automatic, normal, short_slice, realtime"},
    {"LOOM_TUNING_FILE", "loom-tune's measurements for the algorithm selector",
     "unset: built-in alpha 5 us, beta 0.2 ns/B, gamma 0.25 ns/B", "a tuning file path"},
    {"LOOM_CALIBRATION",
     "without LOOM_TUNING_FILE, on the mpi backend with several ranks: the collectives whose "
     "candidates the selector times on first use (Executor compile, loom-collectives -a auto, the "
     "torch process group), every rank together, and caches in LOOM_CALIBRATION_CACHE; 0 keeps "
     "the untuned model",
     "1: allreduce", "0, 1, or a comma list of collectives"},
    {"LOOM_CALIBRATION_CACHE",
     "directory of the calibration cache, one file per host, backend, rank count, placement on "
     "nodes (1node, 2x2nodes, 2+1nodes), transport (shm, tcp), link (`LOOM_LINK`) and collective; "
     "a calibration on a busy host is not cached; a corrupt file is an invalid_argument error "
     "naming it (delete it to recalibrate)",
     "$XDG_CACHE_HOME/loom, else ~/.cache/loom", "a writable directory (created if missing)"},
    {"LOOM_LINK",
     "a name for the network joining the nodes, part of the calibration cache key: set it when "
     "the same hosts are joined by another network (another fabric, a shaped link) so that each "
     "keeps its own calibration",
     "unset", "letters, digits, `-`, `_` (others become `_`)"},
    {"LOOM_ALLREDUCE",
     "algorithms by size range for allreduce, e.g. "
     "\"rd:0-8K;rabenseifner:8K-1M;ring:1M-max\" (names: the algorithm table's, as "
     "loom-collectives --info lists them)",
     "unset: the selector decides", "name:lo-hi;... (K, M, G, max)"},
    {"LOOM_ALLGATHER", "the same for allgather", "unset", "as LOOM_ALLREDUCE"},
    {"LOOM_REDUCE_SCATTER", "the same for reduce_scatter", "unset", "as LOOM_ALLREDUCE"},
    {"LOOM_BROADCAST", "the same for broadcast", "unset", "as LOOM_ALLREDUCE"},
    {"LOOM_REDUCE", "the same for reduce", "unset", "as LOOM_ALLREDUCE"},
    {"LOOM_MPI_CUDA_AWARE",
     "pass device buffers to MPI when it is CUDA-aware; 0 stages them through pinned memory", "1",
     "0, 1"},
    {"LOOM_FLIGHT_RECORDER_SIZE",
     "entries each rank's flight recorder keeps (a fixed-size ring, an operation each or a run "
     "of repeated blocking collectives; dumped on a timeout, mismatch or failure)",
     "2048", "0 to 1048576; 0 keeps none"},
    {"LOOM_FLIGHT_RECORDER_DIR",
     "directory where each rank writes loom_flight_recorder_rank<r>.json on a timeout, mismatch "
     "or failure (read them with loom-flight-recorder)",
     "unset: no dump", "a writable directory (created if missing)"},
    {"LOOM_NCCL_DEVICE", "the GPU of this rank for the nccl backend", "local rank % visible GPUs",
     "0 to 1024"},
    {"LOOM_STORE",
     "a directory every rank of a job started without mpirun reaches (one new directory per "
     "job): the file store the ranks meet through (store_from_environment, Rendezvous)",
     "unset: no store", "a writable directory (created if missing)"},
    {"LOOM_RANK", "this process's rank in the job that meets through LOOM_STORE",
     "unset (needed with LOOM_STORE)", "0 to LOOM_WORLD_SIZE - 1"},
    {"LOOM_WORLD_SIZE", "the number of processes that meet through LOOM_STORE",
     "unset (needed with LOOM_STORE)", "1 to 1048576"},
}};

[[noreturn]] void reject(std::string_view name, const std::string& value,
                         std::string_view expected) {
  throw Error(
      ErrorCode::invalid_argument,
      std::string(name) + "='" + value + "' is not valid (expected " + std::string(expected) + ")");
}

std::optional<int> first_integer(std::initializer_list<const char*> names) {
  for (const char* name : names) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') continue;
    int out = 0;
    const char* end = value + std::char_traits<char>::length(value);
    auto [ptr, ec] = std::from_chars(value, end, out);
    if (ec == std::errc() && ptr == end && out >= 0) return out;
  }
  return std::nullopt;
}

}  // namespace

std::span<const Variable> variables() noexcept {
  return all_variables;
}

std::optional<std::string> text(std::string_view name) {
  const char* value = std::getenv(std::string(name).c_str());
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

std::optional<double> seconds(std::string_view name) {
  const auto value = text(name);
  if (!value) return std::nullopt;
  double out = 0;
  const char* end = value->data() + value->size();
  auto [ptr, ec] = std::from_chars(value->data(), end, out);
  if (ec != std::errc() || ptr != end || !std::isfinite(out) || out < 0)
    throw Error(ErrorCode::invalid_argument,
                std::string(name) + "='" + *value +
                    "' is not a number of seconds (expected e.g. 30 or 0.5; 0 disables the "
                    "watchdog)");
  return out;
}

std::optional<bool> flag(std::string_view name) {
  const auto value = text(name);
  if (!value) return std::nullopt;
  if (*value == "0") return false;
  if (*value == "1") return true;
  reject(name, *value, "0 or 1");
}

std::optional<long long> integer(std::string_view name, long long min, long long max) {
  const auto value = text(name);
  if (!value) return std::nullopt;
  long long out = 0;
  const char* end = value->data() + value->size();
  auto [ptr, ec] = std::from_chars(value->data(), end, out);
  if (ec != std::errc() || ptr != end || out < min || out > max)
    reject(name, *value, "an integer from " + std::to_string(min) + " to " + std::to_string(max));
  return out;
}

std::chrono::nanoseconds timeout_from_seconds(double seconds, std::string_view what) {
  if (!std::isfinite(seconds) || seconds < 0)
    throw Error(ErrorCode::invalid_argument,
                std::string(what) + " must be >= 0 seconds (0 disables the watchdog)");
  // ~31 years never fires in practice; beyond ~292 years the nanosecond count would overflow
  // (found by fuzzing LOOM_TIMEOUT_S), and deadlines add it to now().
  constexpr double longest_s = 1e9;
  return std::chrono::nanoseconds(static_cast<std::int64_t>(std::min(seconds, longest_s) * 1e9));
}

std::chrono::nanoseconds timeout() {
  return timeout_from_seconds(seconds("LOOM_TIMEOUT_S").value_or(default_timeout_s),
                              "LOOM_TIMEOUT_S");
}

std::string seconds_text(double s) {
  char out[32];
  std::snprintf(out, sizeof out, "%g s", s);
  return out;
}

std::optional<int> launcher_local_rank() {
  return first_integer({"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "LOCAL_RANK"});
}

std::optional<int> launcher_local_size() {
  return first_integer({"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE"});
}

namespace {

// A process that called MPI_Init without a launcher (Open MPI's singleton: mpi4py imported by
// PyTorch Lightning to look for mpirun does this) gets PMIX_RANK=0 and OMPI_MCA_ess=singleton in
// its environment; mpirun's ranks get OMPI_MCA_ess=^singleton. Such a process, and the workers
// Lightning's launcher then starts, are not an mpirun job.
bool mpi_singleton() noexcept {
  const char* ess = std::getenv("OMPI_MCA_ess");
  return ess != nullptr && std::string_view(ess) == "singleton";
}

}  // namespace

std::optional<int> launcher_rank() {
  if (mpi_singleton()) return std::nullopt;
  return first_integer({"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"});
}

std::optional<int> launcher_world_size() {
  return first_integer({"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE"});
}

bool launched_by_mpirun() noexcept {
  if (mpi_singleton()) return false;
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"})
    if (std::getenv(name) != nullptr) return true;
  return false;
}

}  // namespace loom::environment
