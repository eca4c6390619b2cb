// Tuning files and LOOM_<COLL> ranges: round trips, and every malformed input named; the
// candidate timing's form.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <vector>

#include "loom/candidate_timing.hpp"
#include "loom/error.hpp"
#include "loom/local.hpp"
#include "loom/tuning.hpp"

namespace loom {
namespace {

// Expects `fn` to throw invalid_argument whose message contains every fragment.
template <class Fn>
void expect_error(Fn fn, std::initializer_list<const char*> fragments) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning " << *fragments.begin();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument) << e.what();
    for (const char* f : fragments)
      EXPECT_NE(std::string(e.what()).find(f), std::string::npos)
          << "'" << e.what() << "' does not mention '" << f << "'";
  }
}

TEST(AlgorithmRanges, ParseTheIssuesExample) {
  const auto r = parse_algorithm_ranges("rd:0-8K;rabenseifner:8K-1M;ring:1M-max");
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].algorithm, Algorithm::recursive_doubling);
  EXPECT_EQ(r[0].min_bytes, 0u);
  EXPECT_EQ(r[0].max_bytes, 8192u);
  EXPECT_EQ(r[1].algorithm, Algorithm::rabenseifner);
  EXPECT_EQ(r[1].min_bytes, 8192u);
  EXPECT_EQ(r[1].max_bytes, 1048576u);
  EXPECT_EQ(r[2].algorithm, Algorithm::ring);
  EXPECT_EQ(r[2].max_bytes, unbounded_bytes);
  EXPECT_EQ(parse_algorithm_ranges("tree:2G-max")[0].min_bytes, std::size_t{2} << 30);
}

TEST(AlgorithmRanges, MalformedTokensAreNamed) {
  expect_error([] { parse_algorithm_ranges("rdd:0-8K"); }, {"'rdd'", "not an algorithm"});
  expect_error([] { parse_algorithm_ranges("rd:0-8Q"); }, {"'8Q'", "rd:0-8Q"});
  expect_error([] { parse_algorithm_ranges("rd0-8K"); }, {"'rd0-8K'", "missing ':'"});
  expect_error([] { parse_algorithm_ranges("rd:08K"); }, {"'rd:08K'", "missing '-'"});
  expect_error([] { parse_algorithm_ranges("rd:8K-8K"); }, {"'rd:8K-8K'", "empty range"});
  expect_error([] { parse_algorithm_ranges("rd:0-8K;;ring:8K-max"); }, {"empty entry"});
  expect_error([] { parse_algorithm_ranges(""); }, {"empty entry"});
  expect_error([] { parse_algorithm_ranges("rd:0-1M;ring:512K-max"); }, {"rd", "ring", "overlap"});
  expect_error([] { parse_algorithm_ranges("ring:-max"); }, {"empty size"});
  expect_error([] { parse_algorithm_ranges("ring:99999999999999999999-max"); },
               {"99999999999999999999"});
}

TEST(TuningFile, RoundTrips) {
  TuningParameters t;
  t.backend = "mpi";
  t.cost = {2.5e-6, 0.125e-9, 0.3e-9};
  t.native.push_back({Collective::allreduce, 4, 6.5e-6, 0.21e-9});
  t.measured.push_back({Collective::allreduce, 4, 1048576, Algorithm::ring, 640.25e-6, 12.5e-6});
  t.measured.push_back({Collective::allgather, 2, 8, Algorithm::bruck, 3e-6});
  const TuningParameters back = parse_tuning_file(format_tuning_file(t));
  EXPECT_EQ(back.backend, "mpi");
  EXPECT_DOUBLE_EQ(back.cost.alpha_s, 2.5e-6);
  EXPECT_DOUBLE_EQ(back.cost.beta_s_per_byte, 0.125e-9);
  EXPECT_DOUBLE_EQ(back.cost.gamma_s_per_byte, 0.3e-9);
  ASSERT_EQ(back.native.size(), 1u);
  EXPECT_EQ(back.native[0].world, 4);
  EXPECT_DOUBLE_EQ(back.native[0].alpha_s, 6.5e-6);
  ASSERT_EQ(back.measured.size(), 2u);
  EXPECT_EQ(back.measured[0].bytes, 1048576u);
  EXPECT_EQ(back.measured[0].algorithm, Algorithm::ring);
  EXPECT_DOUBLE_EQ(back.measured[0].seconds, 640.25e-6);
  EXPECT_DOUBLE_EQ(back.measured[0].spread_seconds, 12.5e-6);
  EXPECT_EQ(back.measured[1].algorithm, Algorithm::bruck);
  EXPECT_EQ(back.measured[1].spread_seconds, 0);
  EXPECT_FALSE(back.inter_node.has_value());
  EXPECT_EQ(back.measured[0].form, TimingForm::unknown);  // no form written: both tables
  EXPECT_EQ(format_tuning_file(t).find("blocking"), std::string::npos);
  // The form each measurement was timed in round-trips.
  t.measured[0].form = TimingForm::asynchronous;
  t.measured[1].form = TimingForm::blocking;
  const std::string formed = format_tuning_file(t);
  EXPECT_NE(formed.find("ring 640.25 12.5 asynchronous\n"), std::string::npos) << formed;
  const TuningParameters forms = parse_tuning_file(formed);
  EXPECT_EQ(forms.measured[0].form, TimingForm::asynchronous);
  EXPECT_EQ(forms.measured[1].form, TimingForm::blocking);
  // The inter-node level round-trips too.
  t.inter_node = CostParameters{48e-6, 8.125e-9, 0};
  const TuningParameters two = parse_tuning_file(format_tuning_file(t));
  ASSERT_TRUE(two.inter_node.has_value());
  EXPECT_DOUBLE_EQ(two.inter_node->alpha_s, 48e-6);
  EXPECT_DOUBLE_EQ(two.inter_node->beta_s_per_byte, 8.125e-9);
  EXPECT_DOUBLE_EQ(two.cost.beta_s_per_byte, 0.125e-9);
}

TEST(TuningFile, TheSpreadOfAMeasurementIsOptional) {
  const std::string head = "loom-tuning 1\nalpha_us 1\nbeta_ns_per_byte 1\ngamma_ns_per_byte 1\n";
  const auto t = parse_tuning_file(head +
                                   "measured allreduce 4 1024 ring 3\n"
                                   "measured allreduce 4 1024 rd 4 0.5\n");
  ASSERT_EQ(t.measured.size(), 2u);
  EXPECT_EQ(t.measured[0].spread_seconds, 0);
  EXPECT_DOUBLE_EQ(t.measured[1].seconds, 4e-6);
  EXPECT_DOUBLE_EQ(t.measured[1].spread_seconds, 0.5e-6);
}

TEST(TuningFile, CommentsAndBlankLinesAreIgnored) {
  const auto t = parse_tuning_file(
      "# measured by hand\n\nloom-tuning 1\nalpha_us 1 # one\n"
      "beta_ns_per_byte 0.5\r\ngamma_ns_per_byte 2\n");
  EXPECT_DOUBLE_EQ(t.cost.alpha_s, 1e-6);
  EXPECT_DOUBLE_EQ(t.cost.beta_s_per_byte, 0.5e-9);
  EXPECT_DOUBLE_EQ(t.cost.gamma_s_per_byte, 2e-9);
}

TEST(TuningFile, MalformedLinesAreNamed) {
  const std::string head = "loom-tuning 1\nalpha_us 1\nbeta_ns_per_byte 1\ngamma_ns_per_byte 1\n";
  expect_error([] { parse_tuning_file(""); }, {"empty"});
  expect_error([] { parse_tuning_file("loom-tuning 2\n"); }, {"line 1", "loom-tuning 1"});
  expect_error([&] { parse_tuning_file(head + "alpha_us fast\n"); }, {"line 5", "'fast'"});
  expect_error([&] { parse_tuning_file(head + "alpha_us -1\n"); }, {"line 5", "'-1'"});
  expect_error([&] { parse_tuning_file(head + "speed 3\n"); }, {"line 5", "unknown key 'speed'"});
  expect_error([&] { parse_tuning_file(head + "measured allreduce 4 1024 ring 3 1 sideways\n"); },
               {"line 5", "form 'sideways'", "blocking or asynchronous"});
  expect_error([&] { parse_tuning_file(head + "native allreduce 4 1\n"); },
               {"line 5", "'native' takes 4 values"});
  expect_error([&] { parse_tuning_file(head + "native allreduse 4 1 1\n"); },
               {"line 5", "'allreduse' is not a collective"});
  expect_error([&] { parse_tuning_file(head + "measured allreduce 4 1024 bruck 3\n"); },
               {"line 5", "'bruck' does not implement allreduce"});
  expect_error([&] { parse_tuning_file(head + "measured allreduce 0 1024 ring 3\n"); },
               {"line 5", "world '0'"});
  expect_error([&] { parse_tuning_file(head + "measured allreduce 4 1k ring 3\n"); },
               {"line 5", "'1k'"});
  expect_error([&] { parse_tuning_file(head + "measured allreduce 4 1024 ring 3 wide\n"); },
               {"line 5", "'wide'"});
  expect_error([&] { parse_tuning_file(head + "measured allreduce 4 1024 ring 3 1 2\n"); },
               {"line 5", "form '2'"});
  expect_error([&] { parse_tuning_file(head + "measured allreduce 4 1024 ring 3 1 blocking x\n"); },
               {"line 5", "'measured' takes 5 values", "[spread_us [form]]"});
  expect_error([] { parse_tuning_file("loom-tuning 1\nalpha_us 1\nbeta_ns_per_byte 1\n"); },
               {"missing gamma_ns_per_byte"});
  expect_error([&] { parse_tuning_file(head + "inter_alpha_us 40\n"); },
               {"inter_alpha_us without inter_beta_ns_per_byte"});
  expect_error([&] { parse_tuning_file(head + "inter_beta_ns_per_byte 8\n"); },
               {"inter_beta_ns_per_byte without inter_alpha_us"});
  expect_error([&] { parse_tuning_file(head + "inter_beta_ns_per_byte slow\n"); },
               {"line 5", "'slow'"});
  expect_error([] { load_tuning_file("/nonexistent/loom.tuning"); }, {"/nonexistent/loom.tuning"});
}

// Each round visits every point once, a size's candidates together, the groups from group
// `round` on, the same order for the same round (every rank computes it alone), and no point
// has the same neighbour before it in every round (a rotation alone kept every neighbour).
TEST(CandidateTiming, VisitsEveryPointOnceARoundAndChangesItsNeighbours) {
  const std::vector<std::size_t> groups{6, 6, 6};  // 3 sizes x native's forms and candidates
  const int rounds = 7;
  std::vector<std::set<std::size_t>> before(18);  // the points each was timed right after
  for (int round = 0; round < rounds; ++round) {
    const std::vector<std::size_t> order = candidate_visit_order(groups, round);
    EXPECT_EQ(order, candidate_visit_order(groups, round)) << "round " << round;
    ASSERT_EQ(order.size(), 18u);
    EXPECT_EQ(std::set<std::size_t>(order.begin(), order.end()).size(), 18u) << "round " << round;
    for (std::size_t turn = 0; turn < 3; ++turn) {
      const std::size_t group = (turn + static_cast<std::size_t>(round)) % 3;
      for (std::size_t k = 0; k < 6; ++k)
        EXPECT_EQ(order[turn * 6 + k] / 6, group) << "round " << round << ", position " << k;
    }
    for (std::size_t k = 1; k < order.size(); ++k)
      if (order[k] / 6 == order[k - 1] / 6) before[order[k]].insert(order[k - 1]);
  }
  for (std::size_t point = 0; point < before.size(); ++point)
    EXPECT_GE(before[point].size(), 2u) << "point " << point << " always ran after the same one";
  EXPECT_NE(candidate_visit_order(groups, 0), candidate_visit_order(groups, 3))
      << "rounds 0 and 3 start at the same group but shuffle it differently";
  EXPECT_TRUE(candidate_visit_order({}, 2).empty());
  const std::vector<std::size_t> uneven = candidate_visit_order({1, 2}, 1);  // group 1 first
  ASSERT_EQ(uneven.size(), 3u);
  EXPECT_EQ(std::set<std::size_t>(uneven.begin(), uneven.begin() + 2),
            (std::set<std::size_t>{1, 2}));
  EXPECT_EQ(uneven[2], 0u);
}

// Native is timed in each form asked for, loom's algorithms once, and the result holds a table
// per form (the local backend's threads as ranks); a form that names neither, or one given
// twice, is refused on every rank before anything is timed.
TEST(CandidateTiming, TimesATablePerFormAndRefusesBadForms) {
  for (const std::vector<TimingForm>& forms :
       {std::vector{TimingForm::blocking}, std::vector{TimingForm::asynchronous},
        std::vector{TimingForm::asynchronous, TimingForm::blocking}}) {
    std::mutex mutex;
    std::vector<std::vector<Measurement>> results;
    LocalWorld::run(3, [&](Backend& b) {
      CandidateTimingOptions o;
      o.sizes = {64, 4096};
      o.rounds = 2;
      o.seconds_per_point = 0.001;
      o.forms = forms;
      std::vector<Measurement> m = time_candidates(b, o);
      const std::lock_guard lock(mutex);
      results.push_back(std::move(m));
    });
    ASSERT_EQ(results.size(), 3u);
    const std::size_t per_form = results[0].size() / forms.size();
    ASSERT_EQ(per_form * forms.size(), results[0].size());
    for (TimingForm form : forms) {
      std::size_t natives = 0, in_form = 0;
      for (const Measurement& m : results[0]) {
        EXPECT_EQ(m.world, 3);
        EXPECT_GT(m.seconds, 0) << to_string(m.algorithm) << " at " << m.bytes;
        if (m.form != form) continue;
        ++in_form;
        natives += m.algorithm == Algorithm::native;
        if (m.algorithm == Algorithm::native) EXPECT_EQ(m.spread_seconds, 0);
      }
      EXPECT_EQ(in_form, per_form) << to_string(form);
      EXPECT_EQ(natives, 2u) << "native at both sizes, " << to_string(form);
    }
    if (forms.size() == 2) {  // loom's algorithms timed once: the same time in both tables
      for (const Measurement& a : results[0])
        for (const Measurement& b : results[0])
          if (a.algorithm == b.algorithm && a.bytes == b.bytes && a.algorithm != Algorithm::native)
            EXPECT_EQ(a.seconds, b.seconds) << to_string(a.algorithm);
    }
    for (const auto& r : results) {  // every rank returns the slowest rank's figures
      ASSERT_EQ(r.size(), results[0].size());
      for (std::size_t k = 0; k < r.size(); ++k) EXPECT_EQ(r[k].seconds, results[0][k].seconds);
    }
  }
  for (const auto& [forms, message] :
       {std::pair{std::vector{TimingForm::unknown},
                  "a form must be blocking or asynchronous, not unknown"},
        std::pair{std::vector{TimingForm::blocking, TimingForm::blocking},
                  "the form blocking is given twice"},
        std::pair{std::vector<TimingForm>{}, "no form to time"}}) {
    std::atomic<int> refused{0};
    LocalWorld::run(2, [&](Backend& b) {
      CandidateTimingOptions o;
      o.sizes = {64};
      o.forms = forms;
      try {
        time_candidates(b, o);
      } catch (const Error& e) {
        if (e.code() == ErrorCode::invalid_argument &&
            std::string(e.what()).find(message) != std::string::npos)
          ++refused;
      }
    });
    EXPECT_EQ(refused.load(), 2) << message;
  }
}

}  // namespace
}  // namespace loom
