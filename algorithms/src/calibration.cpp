// Calibration: the cache key, rank 0's cache reads and writes broadcast to every rank, the
// timing, and the busy-host check that keeps a calibration timed under load out of the cache.
#include "loom/calibration.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include <sys/resource.h>
#include <unistd.h>

#include "loom/candidate_timing.hpp"
#include "loom/environment.hpp"
#include "loom/error.hpp"

namespace loom {
namespace {

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "unknown-host";
  std::string out;
  // The name becomes part of a file name: keep it to characters that are safe there.
  for (char c : std::string(name))
    out += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ? c : '_';
  return out.empty() ? "unknown-host" : out;
}

std::uint64_t fnv1a(const std::string& text) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Every rank's host-name hash, by rank (as int64: the backend has no unsigned 64-bit type).
std::vector<std::int64_t> host_hashes(Backend& b) {
  const auto mine = static_cast<std::int64_t>(fnv1a(host_name()));
  std::vector<std::int64_t> all(static_cast<std::size_t>(b.world_size()));
  std::int64_t send = mine;
  b.allgather(Buffer(&send, 1, DType::int64), Buffer(all.data(), all.size(), DType::int64));
  return all;
}

// Whether OMPI_MCA_btl (what mpirun --mca btl passes to the ranks) lets Open MPI use shared
// memory: unset, naming vader or sm, or an exclusion ("^tcp") that names neither.
bool btl_allows_shared_memory() {
  const auto btl = environment::text("OMPI_MCA_btl");
  if (!btl) return true;
  const bool exclusion = btl->front() == '^';
  std::vector<std::string> names;
  std::stringstream list(exclusion ? btl->substr(1) : *btl);
  for (std::string name; std::getline(list, name, ',');) names.push_back(name);
  const bool named = std::find(names.begin(), names.end(), "vader") != names.end() ||
                     std::find(names.begin(), names.end(), "sm") != names.end();
  return exclusion ? !named : named;
}

// Rank 0's `text` on every rank.
std::string broadcast_text(Backend& b, std::string text) {
  std::int64_t size = static_cast<std::int64_t>(text.size());
  b.broadcast(Buffer(&size, 1, DType::int64), 0);
  text.resize(static_cast<std::size_t>(size));
  if (size > 0) b.broadcast(Buffer(text.data(), text.size(), DType::uint8), 0);
  return text;
}

// CPU time: the whole host's busy time (/proc/stat) and this process's (getrusage), seconds.
struct CpuSample {
  double host_busy_s = -1;  // negative: /proc/stat unreadable
  double own_s = 0;
  std::chrono::steady_clock::time_point at;
};

CpuSample sample_cpu() {
  CpuSample s;
  s.at = std::chrono::steady_clock::now();
  rusage usage{};
  if (::getrusage(RUSAGE_SELF, &usage) == 0)
    s.own_s = static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
              static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
  std::ifstream stat("/proc/stat");
  std::string cpu;
  unsigned long long user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0,
                     steal = 0;
  if (stat >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal &&
      cpu == "cpu")
    s.host_busy_s = static_cast<double>(user + nice + system + irq + softirq + steal) /
                    static_cast<double>(::sysconf(_SC_CLK_TCK));
  return s;
}

// The largest share of a host's CPU time used by processes other than this job's ranks
// between `before` and `after`, over every host of the job (negative when unknown). Collective.
double others_cpu_share(Backend& b, const CpuSample& before, const CpuSample& after,
                        const std::vector<std::int64_t>& hosts) {
  const double wall = std::chrono::duration<double>(after.at - before.at).count();
  const bool known = before.host_busy_s >= 0 && after.host_busy_s >= 0;
  const double cpus = static_cast<double>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
  double mine[3] = {known ? after.host_busy_s - before.host_busy_s : -1, after.own_s - before.own_s,
                    cpus * std::max(wall, 1e-9)};
  const auto n = static_cast<std::size_t>(b.world_size());
  std::vector<double> all(3 * n);
  b.allgather(Buffer(mine, 3, DType::float64), Buffer(all.data(), all.size(), DType::float64));
  double worst = 0;
  for (std::size_t first = 0; first < n; ++first) {
    if (std::find(hosts.begin(), hosts.begin() + static_cast<std::ptrdiff_t>(first),
                  hosts[first]) != hosts.begin() + static_cast<std::ptrdiff_t>(first))
      continue;  // this host was counted at its first rank
    double host_busy = 0, ours = 0, capacity = 0;
    for (std::size_t r = first; r < n; ++r) {
      if (hosts[r] != hosts[first]) continue;
      if (all[3 * r] < 0) return -1;
      host_busy = std::max(host_busy, all[3 * r]);
      ours += all[3 * r + 1];
      capacity = std::max(capacity, all[3 * r + 2]);
    }
    worst = std::max(worst, (host_busy - ours) / capacity);
  }
  return worst;
}

// Why the cache text `text` cannot be used for `key` ("" when it can); fills `out`.
std::string check_cache(const std::string& text, const CalibrationKey& key,
                        std::vector<Measurement>& out) {
  TuningParameters t;
  try {
    t = parse_tuning_file(text);
  } catch (const Error& e) {
    return e.message();
  }
  if (t.backend != key.backend)
    return "measured on the '" + t.backend + "' backend, expected '" + key.backend + "'";
  if (t.measured.empty()) return "holds no measurements";
  for (const Measurement& m : t.measured)
    if (m.collective != key.collective || m.world != key.world)
      return "holds a measurement of " + std::string(to_string(m.collective)) + " on " +
             std::to_string(m.world) + " ranks, expected " +
             std::string(to_string(key.collective)) + " on " + std::to_string(key.world);
  out = std::move(t.measured);
  return "";
}

// Writes `text` to `path` through a temporary file renamed into place, so that a job reading
// the cache never sees half a file; "" on success, else why not.
std::string write_cache(const std::string& path, const std::string& text) {
  std::error_code error;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), error);
  if (error) return "cannot create its directory (" + error.message() + ")";
  const std::string temporary = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(temporary);
    out << text;
    if (!(out.flush())) return "cannot write " + temporary;
  }
  std::filesystem::rename(temporary, path, error);
  if (error) return "cannot rename " + temporary + " (" + error.message() + ")";
  return "";
}

// Rank 0's calibrations that were not cached, by cache path: the next construction in this
// process (the executor compiles each graph) uses them instead of timing again.
std::mutex uncached_mutex;
std::map<std::string, std::string> uncached;

std::string collective_list(const std::vector<Collective>& collectives) {
  std::string list;
  for (Collective c : collectives) list += (list.empty() ? "" : ",") + std::string(to_string(c));
  return list;
}

}  // namespace

std::vector<std::size_t> CalibrationOptions::default_sizes() {
  // Every power of two up to 16 MiB: the selector interpolates between measured sizes, and a
  // backend's own allreduce changes protocol at sizes of its own (on the emulated 2 x 2 cluster
  // Open MPI's doubled from 4 to 8 KiB, 81 to 162 us, where recursive doubling took 93 us: an
  // interpolation from 4 and 16 KiB kept native there, at 0.57x the best). Above 1 MiB too:
  // with only 4 and 16 MiB measured, 2 ranks on shared memory interpolated Rabenseifner ahead
  // at 8 MiB, where ring ran 3-11% faster in 4 launches of 5.
  std::vector<std::size_t> sizes;
  for (std::size_t s = 16; s <= (std::size_t{16} << 20); s *= 2) sizes.push_back(s);
  return sizes;
}

std::optional<CalibrationOptions> CalibrationOptions::from_environment() {
  CalibrationOptions o;
  if (const auto value = environment::text("LOOM_CALIBRATION")) {
    if (*value == "0") return std::nullopt;
    if (*value != "1") {
      o.collectives.clear();
      std::stringstream list(*value);
      for (std::string name; std::getline(list, name, ',');) {
        try {
          o.collectives.push_back(parse_collective(name));
        } catch (const Error& e) {
          throw Error(
              ErrorCode::invalid_argument,
              "LOOM_CALIBRATION='" + *value +
                  "' is not valid (expected 0, 1 or a comma list of collectives): " + e.message());
        }
      }
    }
  }
  if (const auto directory = environment::text("LOOM_CALIBRATION_CACHE"))
    o.cache_directory = *directory;
  else if (const auto xdg = environment::text("XDG_CACHE_HOME"))
    o.cache_directory = *xdg + "/loom";
  else if (const auto home = environment::text("HOME"))
    o.cache_directory = *home + "/.cache/loom";
  else
    o.cache_directory = ".loom-calibration";
  return o;
}

std::string CalibrationKey::file_name() const {
  return host + "." + backend + "." + std::to_string(world) + "ranks." + nodes + "." + transport +
         "." + (link.empty() ? "" : link + ".") + std::string(to_string(collective)) + ".tuning";
}

std::string nodes_key(const Topology& topology) {
  if (topology.node_count() == 1) return "1node";
  if (topology.uniform())
    return std::to_string(topology.node_count()) + "x" +
           std::to_string(topology.ranks_of_node(0).size()) + "nodes";
  std::string text;
  for (int node = 0; node < topology.node_count(); ++node)
    text += (node ? "+" : "") + std::to_string(topology.ranks_of_node(node).size());
  return text + "nodes";
}

namespace {

// The key from every rank's host hash (host_hashes). Collective.
CalibrationKey key_from_hosts(Backend& backend, const std::vector<std::int64_t>& hosts,
                              Collective collective) {
  const bool one_host =
      std::all_of(hosts.begin(), hosts.end(), [&](std::int64_t h) { return h == hosts.front(); });
  // Rank 0's view, broadcast: the ranks' environments may differ in OMPI_MCA_btl.
  const std::string transport =
      broadcast_text(backend, one_host && btl_allows_shared_memory() ? "shm" : "tcp");
  CalibrationKey key;
  key.host = broadcast_text(backend, host_name());
  key.backend = std::string(backend.name());
  key.world = backend.world_size();
  key.transport = transport;
  key.collective = collective;
  key.nodes = nodes_key(backend.topology());
  // Rank 0's LOOM_LINK, kept to characters that are safe in a file name.
  std::string link;
  for (char c : environment::text("LOOM_LINK").value_or(""))
    link += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ? c : '_';
  key.link = broadcast_text(backend, link);
  return key;
}

}  // namespace

CalibrationKey calibration_key(Backend& backend, Collective collective) {
  return key_from_hosts(backend, host_hashes(backend), collective);
}

Calibration calibrate(Backend& backend, const CalibrationOptions& options) {
  if (options.cache_directory.empty())
    throw Error(ErrorCode::invalid_argument, "calibrate: no cache directory");
  Calibration result;
  const bool rank0 = backend.rank() == 0;
  if (options.collectives.empty()) return result;
  // One key for the job (host, transport: communication), then one per collective.
  const std::vector<std::int64_t> hosts = host_hashes(backend);
  const CalibrationKey job = key_from_hosts(backend, hosts, options.collectives.front());
  for (Collective collective : options.collectives) {
    CalibrationReport report;
    report.key = job;
    report.key.collective = collective;
    report.path =
        (std::filesystem::path(options.cache_directory) / report.key.file_name()).string();

    // Rank 0 reads the cache; every rank gets its verdict: "cached\n<text>", "error\n<why>" or
    // "time\n".
    std::string verdict;
    if (rank0) {
      std::ifstream in(report.path);
      if (!in) {
        const std::lock_guard lock(uncached_mutex);
        const auto earlier = uncached.find(report.path);
        verdict = earlier == uncached.end() ? "time\n" : "cached\n" + earlier->second;
      } else {
        std::stringstream text;
        text << in.rdbuf();
        std::vector<Measurement> held;
        const std::string why = check_cache(text.str(), report.key, held);
        const auto has = [&](TimingForm form) {
          return std::any_of(held.begin(), held.end(),
                             [&](const Measurement& m) { return m.form == form; });
        };
        if (!why.empty()) {
          verdict = "error\n" + why;
        } else if (!has(TimingForm::asynchronous) || !has(TimingForm::blocking)) {
          // Written before calibrations timed both forms (they timed native's blocking call
          // only): its choices would be wrong for the asynchronous path loom runs.
          std::fprintf(stderr,
                       "loom: calibration cache %s does not hold both timing forms (written "
                       "before loom timed native's blocking and asynchronous calls apart); "
                       "timing it again\n",
                       report.path.c_str());
          verdict = "time\n";
        } else {
          verdict = "cached\n" + text.str();
        }
      }
    }
    verdict = broadcast_text(backend, verdict);
    const std::string status = verdict.substr(0, verdict.find('\n'));
    const std::string body = verdict.substr(std::min(verdict.size(), status.size() + 1));
    if (status == "error")
      throw Error(ErrorCode::invalid_argument, "calibration cache " + report.path + ": " + body +
                                                   " (delete the file to recalibrate)");
    if (status == "cached") {
      std::vector<Measurement> measured;
      check_cache(body, report.key, measured);
      report.from_cache = true;
      result.measured.insert(result.measured.end(), measured.begin(), measured.end());
      result.reports.push_back(std::move(report));
      continue;
    }

    if (rank0) {
      std::fprintf(stderr, "loom: calibrating %s for %d ranks (%s) ... ",
                   std::string(to_string(collective)).c_str(), report.key.world,
                   report.key.transport.c_str());
      std::fflush(stderr);
    }
    CandidateTimingOptions timing;
    timing.collectives = {collective};
    timing.sizes = options.sizes;
    timing.rounds = options.rounds;
    timing.seconds_per_point = options.seconds_per_point;
    // Both forms (TimingForm): the executor, the torch process group and GradientReducer run
    // native's nonblocking call polled to completion; TunedCollectives' blocking calls and
    // loom-collectives its blocking one. Native is timed once more, loom's algorithms not.
    timing.forms = {TimingForm::asynchronous, TimingForm::blocking};
    const CpuSample before = sample_cpu();
    TuningParameters tuning = default_tuning();
    tuning.backend = report.key.backend;
    tuning.measured = time_candidates(backend, timing);
    const CpuSample after = sample_cpu();
    report.others_cpu_share = others_cpu_share(backend, before, after, hosts);
    const double seconds = std::chrono::duration<double>(after.at - before.at).count();

    // Rank 0 decides and writes; every rank parses the same text.
    std::string text = "# loom calibration of " + std::string(to_string(collective)) + " on " +
                       std::to_string(report.key.world) + " ranks (" + report.key.transport +
                       ") of host " + report.key.host + "; delete to recalibrate\n" +
                       format_tuning_file(tuning);
    std::string why_not;
    if (rank0) {
      if (report.others_cpu_share > options.busy_threshold) {
        char line[160];
        std::snprintf(line, sizeof line,
                      "the host was busy (other processes used %.0f%% of its CPU time, above "
                      "%.0f%%)",
                      report.others_cpu_share * 100, options.busy_threshold * 100);
        why_not = line;
      } else {
        why_not = write_cache(report.path, text);
      }
    }
    why_not = broadcast_text(backend, why_not);
    text = broadcast_text(backend, text);
    report.cached = why_not.empty();
    report.not_cached_because = why_not;
    if (rank0 && !report.cached) {
      const std::lock_guard lock(uncached_mutex);
      uncached[report.path] = text;
    }
    if (rank0) {
      if (report.cached)
        std::fprintf(stderr, "cached in %s (%.1f s)\n", report.path.c_str(), seconds);
      else
        std::fprintf(stderr, "not cached in %s: %s (%.1f s)\n", report.path.c_str(),
                     why_not.c_str(), seconds);
    }
    std::vector<Measurement> measured;
    if (const std::string why = check_cache(text, report.key, measured); !why.empty())
      throw Error(ErrorCode::internal, "calibration of " + collective_list({collective}) +
                                           " produced a table it cannot read: " + why);
    result.measured.insert(result.measured.end(), measured.begin(), measured.end());
    result.reports.push_back(std::move(report));
  }
  return result;
}

}  // namespace loom
