// The calibration over real ranks: every rank chooses alike, the cache is written then read
// without timing, keyed by rank count, LOOM_CALIBRATION=0 keeps the model, a corrupt cache is an
// error on every rank, a cache without both timing forms is timed again, and a calibration on
// a busy host is not cached. ctest runs it under
// mpirun with 2 and 3 ranks.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include "backends/mpi_world.hpp"
#include "loom/algorithm_selector.hpp"
#include "loom/calibration.hpp"
#include "loom/error.hpp"
#include "loom/executor.hpp"
#include "loom/tuning.hpp"
#include "scoped_env.hpp"

namespace loom {
namespace {

using testing::expect_all_ranks_ok;
using testing::world;

// Rank 0's `text` on every rank.
std::string from_rank0(std::string text) {
  std::int64_t size = static_cast<std::int64_t>(text.size());
  world().broadcast(Buffer(&size, 1, DType::int64), 0);
  text.resize(static_cast<std::size_t>(size));
  if (size > 0) world().broadcast(Buffer(text.data(), text.size(), DType::uint8), 0);
  return text;
}

// A fresh directory made by rank 0, the same path on every rank, removed at the end of a test.
class TemporaryDirectory {
 public:
  TemporaryDirectory() {
    std::string made;
    if (world().rank() == 0) {
      std::string pattern =
          (std::filesystem::temp_directory_path() / "loom-calibration-XXXXXX").string();
      if (::mkdtemp(pattern.data()) != nullptr) made = pattern;
    }
    _path = from_rank0(made);
  }
  ~TemporaryDirectory() {
    world().barrier();
    if (world().rank() == 0) std::filesystem::remove_all(_path);
  }
  const std::string& path() const { return _path; }

 private:
  std::string _path;
};

// A short calibration: two sizes, two rounds; never "busy" unless a test says so.
CalibrationOptions quick(const std::string& directory) {
  CalibrationOptions o;
  o.sizes = {64, 64 * 1024};
  o.rounds = 2;
  o.seconds_per_point = 0.002;
  o.cache_directory = directory;
  o.busy_threshold = 1e9;
  return o;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

CollectiveArgs allreduce_of(std::vector<float>& v) {
  const Buffer b = Buffer::of(std::span(v));
  return {Collective::allreduce, b, b, ReduceOp::sum, 0};
}

TEST(MpiCalibration, EveryRankChoosesTheSameAlgorithmPerSize) {
  Backend& b = world();
  TemporaryDirectory directory;
  const AlgorithmSelector selector = AlgorithmSelector::for_backend(b, quick(directory.path()));
  std::string failure;
  if (selector.using_defaults()) failure = "the selector kept its defaults";
  if (selector.origin().find("calibration") == std::string::npos)
    failure += " origin '" + selector.origin() + "'";
  // Every size from 4 B to 4 MiB, calibrated or not: the chosen algorithm's index per size.
  std::vector<std::int32_t> mine;
  for (std::size_t count = 1; count <= (std::size_t{1} << 20); count *= 4) {
    std::vector<float> v(count);
    const AlgorithmChoice choice = selector.choose(allreduce_of(v), b);
    mine.push_back(static_cast<std::int32_t>(choice.algorithm));
    if (count == 16 && choice.reason.find("measured") == std::string::npos)
      failure += " 64 B chosen by '" + choice.reason + "', not by the measurements";
  }
  std::vector<std::int32_t> all(mine.size() * static_cast<std::size_t>(b.world_size()));
  b.allgather(Buffer::of(std::span(mine)), Buffer::of(std::span(all)));
  for (int r = 1; r < b.world_size(); ++r)
    for (std::size_t k = 0; k < mine.size(); ++k)
      if (all[r * mine.size() + k] != all[k])
        failure += " rank " + std::to_string(r) + " chose " +
                   std::string(to_string(static_cast<Algorithm>(all[r * mine.size() + k]))) +
                   " at size index " + std::to_string(k) + ", rank 0 " +
                   std::string(to_string(static_cast<Algorithm>(all[k])));
  expect_all_ranks_ok(failure);
}

TEST(MpiCalibration, IsCachedThenReadWithoutTiming) {
  Backend& b = world();
  TemporaryDirectory directory;
  const Calibration first = calibrate(b, quick(directory.path()));
  std::string failure;
  ASSERT_EQ(first.reports.size(), 1u);
  const CalibrationReport& made = first.reports[0];
  if (made.from_cache || !made.cached)
    failure = "first calibration: from_cache " + std::to_string(made.from_cache) + ", cached " +
              std::to_string(made.cached) + " (" + made.not_cached_because + ")";
  if (made.path.find(std::to_string(b.world_size()) + "ranks") == std::string::npos)
    failure += " path " + made.path + " does not name the rank count";
  if (first.measured.empty()) failure += " nothing measured";
  const std::string written = b.rank() == 0 ? read_text(made.path) : "";
  if (b.rank() == 0 && written.find("measured allreduce") == std::string::npos)
    failure += " cache file holds '" + written + "'";
  if (b.rank() == 0 && (written.find(" native ") == std::string::npos ||
                        written.find(" asynchronous\n") == std::string::npos ||
                        written.find(" blocking\n") == std::string::npos))
    failure += " cache file does not hold both forms: '" + written + "'";

  const Calibration second = calibrate(b, quick(directory.path()));
  if (!second.reports.at(0).from_cache) failure += " second calibration timed again";
  if (second.measured.size() != first.measured.size()) failure += " measurement count differs";
  for (std::size_t k = 0; k < std::min(first.measured.size(), second.measured.size()); ++k)
    if (second.measured[k].algorithm != first.measured[k].algorithm ||
        std::abs(second.measured[k].seconds - first.measured[k].seconds) >
            1e-6 * first.measured[k].seconds)
      failure += " measurement " + std::to_string(k) + " differs from the cached one";
  if (b.rank() == 0 && read_text(made.path) != written) failure += " the cache file was rewritten";
  expect_all_ranks_ok(failure);
}

// A cache written before calibrations timed both forms (no form on its lines: native's
// blocking call was timed), or one holding a single form, is timed again and replaced; nothing
// of it is used.
TEST(MpiCalibration, ACacheWithoutBothTimingFormsIsTimedAgain) {
  Backend& b = world();
  TemporaryDirectory directory;
  const std::string path =
      directory.path() + "/" + calibration_key(b, Collective::allreduce).file_name();
  for (TimingForm form : {TimingForm::unknown, TimingForm::blocking, TimingForm::asynchronous}) {
    if (b.rank() == 0) {
      // Valid for this job, with loom's algorithms hopelessly slow: kept, they would show.
      TuningParameters t = default_tuning();
      t.backend = "mpi";
      for (std::size_t bytes : {64, 64 * 1024})
        for (Algorithm a : candidates(Collective::allreduce))
          t.measured.push_back({Collective::allreduce, b.world_size(), bytes, a,
                                a == Algorithm::native ? 1e-6 : 1.0, 0, form});
      std::ofstream(path) << format_tuning_file(t);
    }
    b.barrier();
    const Calibration c = calibrate(b, quick(directory.path()));
    std::string failure;
    const CalibrationReport& r = c.reports.at(0);
    if (r.from_cache) failure = "read the cache holding " + std::string(to_string(form));
    if (!r.cached) failure += " not cached (" + r.not_cached_because + ")";
    for (const Measurement& m : c.measured)
      if (m.algorithm != Algorithm::native && m.seconds >= 1.0)
        failure += " kept the old table's " + std::string(to_string(m.algorithm));
    const std::string now = b.rank() == 0 ? read_text(path) : "";
    if (b.rank() == 0 && (now.find(" asynchronous\n") == std::string::npos ||
                          now.find(" blocking\n") == std::string::npos))
      failure += " the cache was not replaced: '" + now + "'";
    expect_all_ranks_ok(failure.empty() ? failure
                                        : failure + " (" + std::string(to_string(form)) + ")");
  }
}

TEST(MpiCalibration, AnotherRankCountDoesNotReuseTheCache) {
  Backend& b = world();
  TemporaryDirectory directory;
  CalibrationKey other = calibration_key(b, Collective::allreduce);
  other.world = b.world_size() + 1;
  if (b.rank() == 0) {
    // A valid cache for one rank more, in which native is hopelessly slow.
    TuningParameters t = default_tuning();
    t.backend = "mpi";
    for (Algorithm a : candidates(Collective::allreduce))
      t.measured.push_back(
          {Collective::allreduce, other.world, 64, a, a == Algorithm::native ? 1.0 : 1e-6, 0});
    std::ofstream(directory.path() + "/" + other.file_name()) << format_tuning_file(t);
  }
  b.barrier();
  const Calibration c = calibrate(b, quick(directory.path()));
  std::string failure;
  const CalibrationReport& r = c.reports.at(0);
  if (r.from_cache) failure = "used the cache of " + std::to_string(other.world) + " ranks";
  if (r.path == directory.path() + "/" + other.file_name()) failure += " same path";
  for (const Measurement& m : c.measured)
    if (m.world != b.world_size()) failure += " measurement for " + std::to_string(m.world);
  expect_all_ranks_ok(failure);
}

TEST(MpiCalibration, ZeroKeepsTheModel) {
  Backend& b = world();
  TemporaryDirectory directory;
  const AlgorithmSelector selector = [&] {
    test::ScopedEnv off("LOOM_CALIBRATION", "0");
    test::ScopedEnv cache("LOOM_CALIBRATION_CACHE", directory.path().c_str());
    return AlgorithmSelector::for_backend(b);
  }();
  std::string failure;
  if (!selector.using_defaults()) failure = "origin " + selector.origin();
  std::vector<float> v(16);
  const AlgorithmChoice choice = selector.choose(allreduce_of(v), b);
  if (choice.reason != "model") failure += " reason '" + choice.reason + "'";
  if (b.rank() == 0 && !std::filesystem::is_empty(directory.path()))
    failure += " something was written to the cache";
  expect_all_ranks_ok(failure);
}

TEST(MpiCalibration, CorruptOrMismatchedCacheIsAnErrorOnEveryRank) {
  Backend& b = world();
  TemporaryDirectory directory;
  const std::string path =
      directory.path() + "/" + calibration_key(b, Collective::allreduce).file_name();
  TuningParameters other_collective = default_tuning();
  other_collective.backend = "mpi";
  other_collective.measured.push_back(
      {Collective::allgather, b.world_size(), 64, Algorithm::native, 1e-6, 0});
  for (const std::string& content :
       {std::string("loom-tuning 1\nmeasured allreduce two 64 ring x\n"),
        format_tuning_file(other_collective)}) {
    if (b.rank() == 0) std::ofstream(path) << content;
    b.barrier();
    std::string failure = "no error";
    try {
      calibrate(b, quick(directory.path()));
    } catch (const Error& e) {
      failure.clear();
      const std::string message = e.what();
      if (e.code() != ErrorCode::invalid_argument)
        failure = "code " + std::string(to_string(e.code()));
      if (message.find(path) == std::string::npos) failure += " message without the path";
      if (message.find("delete the file to recalibrate") == std::string::npos)
        failure += " message without the remedy";
    }
    expect_all_ranks_ok(failure.empty() ? failure : failure + " for cache '" + content + "'");
  }
}

// The executor calibrates in compile(): with a cache already there (a short calibration made
// first), its choice is the measured one and nothing is timed again.
TEST(MpiCalibration, ExecutorUsesTheCachedCalibration) {
  Backend& b = world();
  TemporaryDirectory directory;
  calibrate(b, quick(directory.path()));
  const std::string path =
      directory.path() + "/" + calibration_key(b, Collective::allreduce).file_name();
  const std::string written = b.rank() == 0 ? read_text(path) : "";
  std::vector<float> v(16, 1.0f);
  Graph g;
  g.allreduce("small", Buffer::of(std::span(v)));
  ExecutorOptions options;
  options.profile = true;
  std::optional<test::ScopedEnv> on(std::in_place, "LOOM_CALIBRATION", "1");
  std::optional<test::ScopedEnv> cache(std::in_place, "LOOM_CALIBRATION_CACHE",
                                       directory.path().c_str());
  Executor ex(g, b, options);
  cache.reset();
  on.reset();
  ex.run();
  std::string failure;
  for (const NodeTiming& t : ex.last_run())
    if (t.name == "small" && t.algorithm_reason.find("measured") == std::string::npos)
      failure = "small ran " + t.algorithm + " because '" + t.algorithm_reason + "'";
  if (v[0] != static_cast<float>(b.world_size())) failure += " wrong sum";
  if (b.rank() == 0 && read_text(path) != written) failure += " the cache was rewritten";
  expect_all_ranks_ok(failure);
}

TEST(MpiCalibration, BusyHostIsNotCached) {
  Backend& b = world();
  TemporaryDirectory directory;
  CalibrationOptions options = quick(directory.path());
  options.busy_threshold = -1;  // any share counts as busy
  const Calibration c = calibrate(b, options);
  std::string failure;
  const CalibrationReport& r = c.reports.at(0);
  if (r.cached || r.from_cache) failure = "cached or read";
  if (r.not_cached_because.find("busy") == std::string::npos)
    failure += " reason '" + r.not_cached_because + "'";
  if (c.measured.empty()) failure += " nothing measured for this run";
  if (b.rank() == 0 && std::filesystem::exists(r.path)) failure += " " + r.path + " written";
  // The same process does not time again: it remembers what it timed.
  const Calibration again = calibrate(b, options);
  if (!again.reports.at(0).from_cache) failure += " timed again in the same process";
  if (b.rank() == 0 && std::filesystem::exists(r.path)) failure += " written the second time";
  expect_all_ranks_ok(failure);
}

// A rank that keeps the model (LOOM_CALIBRATION=0, LOOM_TUNING_FILE) or whose environment is
// malformed (LOOM_CALIBRATION, LOOM_ALLREDUCE, a tuning file it cannot read), beside ranks that
// calibrate: every rank gets a named error at once, not a wait in the calibration's collectives
// or compile's checks until the watchdog.
TEST(MpiCalibration, RanksThatDisagreeAreAnErrorOnEveryRank) {
  Backend& b = world();
  TemporaryDirectory directory;
  const int last = b.world_size() - 1;
  const bool odd_one = b.rank() == last;
  // A valid tuning file outside the cache directory (which must stay empty).
  const std::string tuning = directory.path() + ".tuning";
  if (b.rank() == 0) {
    TuningParameters parameters = default_tuning();
    parameters.backend = "mpi";
    std::ofstream(tuning) << format_tuning_file(parameters);
  }
  b.barrier();
  const std::string malformed_says =
      "a malformed LOOM_TUNING_FILE, LOOM_CALIBRATION or LOOM_<COLLECTIVE>";
  struct Case {
    std::string variable, value;
    std::string says;       // what the other ranks' message says of the last rank
    std::string own_error;  // the last rank's own error, where its environment is malformed
  };
  const std::vector<Case> cases = {
      {"LOOM_CALIBRATION", "0", "no calibration (LOOM_CALIBRATION=0)", ""},
      {"LOOM_TUNING_FILE", tuning, "LOOM_TUNING_FILE, no calibration", ""},
      {"LOOM_CALIBRATION", "allreduce,everything", malformed_says,
       "LOOM_CALIBRATION='allreduce,everything'"},
      {"LOOM_ALLREDUCE", "warp-speed", malformed_says, "LOOM_ALLREDUCE: "},
      {"LOOM_TUNING_FILE", "/nonexistent/loom.tuning", malformed_says,
       "cannot read the tuning file '/nonexistent/loom.tuning'"}};
  for (const Case& c : cases) {
    test::ScopedEnv cache("LOOM_CALIBRATION_CACHE", directory.path().c_str());
    test::ScopedEnv calibration("LOOM_CALIBRATION", "allreduce");
    std::optional<test::ScopedEnv> odd;
    if (odd_one) odd.emplace(c.variable.c_str(), c.value.c_str());
    const std::string tag = c.variable + "=" + c.value + ": ";
    std::string failure = tag + "no error";
    try {
      AlgorithmSelector::for_backend(b);
    } catch (const Error& e) {
      const std::string message = e.what();
      failure.clear();
      if (odd_one && !c.own_error.empty()) {
        // The malformed variable's own rank names it.
        if (e.code() != ErrorCode::invalid_argument ||
            message.find(c.own_error) == std::string::npos)
          failure = tag + "own error " + message;
      } else {
        if (e.code() != ErrorCode::mismatch) failure += "code " + std::string(to_string(e.code()));
        const std::string others =
            last == 1 ? "rank 0: calibrates allreduce" : "ranks 0, 1: calibrates allreduce";
        for (const std::string& part :
             {others, "rank " + std::to_string(last) + ": " + c.says, std::string("disagree")})
          if (message.find(part) == std::string::npos) failure += " without '" + part + "'";
        if (!failure.empty()) failure = tag + failure + " in: " + message;
      }
    }
    expect_all_ranks_ok(failure);
    if (b.rank() == 0 && !std::filesystem::is_empty(directory.path()))
      ADD_FAILURE() << "a calibration was written to the cache";
  }
  b.barrier();
  if (b.rank() == 0) std::filesystem::remove(tuning);
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  return loom::testing::run_all_tests_on_every_rank(argc, argv);
}
