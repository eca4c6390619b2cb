// Tests runtime/environment: one rule set for every LOOM_* variable, and README's table says
// exactly what environment::variables() says.
#include "loom/environment.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "loom/error.hpp"
#include "scoped_env.hpp"

namespace loom {
namespace {

std::string error_of(auto&& call) {
  try {
    call();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    return e.message();
  }
  return "no error";
}

TEST(Environment, UnsetAndEmptyAreTheSame) {
  test::ScopedEnv no_loom_test_value("LOOM_TEST_VALUE", nullptr);
  EXPECT_FALSE(environment::text("LOOM_TEST_VALUE"));
  test::ScopedEnv empty("LOOM_TEST_VALUE", "");
  EXPECT_FALSE(environment::text("LOOM_TEST_VALUE"));
  EXPECT_FALSE(environment::seconds("LOOM_TEST_VALUE"));
  EXPECT_FALSE(environment::flag("LOOM_TEST_VALUE"));
  EXPECT_FALSE(environment::integer("LOOM_TEST_VALUE", 0, 5));
}

TEST(Environment, SecondsAcceptPlainDecimalsOnly) {
  for (const auto& [text, expected] :
       std::map<std::string, double>{{"30", 30}, {"0.5", 0.5}, {"0", 0}, {"1e3", 1000}}) {
    test::ScopedEnv v("LOOM_TEST_SECONDS", text.c_str());
    EXPECT_EQ(environment::seconds("LOOM_TEST_SECONDS"), expected) << text;
  }
  for (const char* bad : {"abc", "-1", "inf", "nan", " 5", "5 ", "+5", "0x10", "5s"}) {
    test::ScopedEnv v("LOOM_TEST_SECONDS", bad);
    EXPECT_EQ(error_of([] { environment::seconds("LOOM_TEST_SECONDS"); }),
              std::string("LOOM_TEST_SECONDS='") + bad +
                  "' is not a number of seconds (expected e.g. 30 or 0.5; 0 disables the "
                  "watchdog)");
  }
}

TEST(Environment, FlagsAreZeroOrOne) {
  {
    test::ScopedEnv v("LOOM_TEST_FLAG", "1");
    EXPECT_EQ(environment::flag("LOOM_TEST_FLAG"), true);
  }
  {
    test::ScopedEnv v("LOOM_TEST_FLAG", "0");
    EXPECT_EQ(environment::flag("LOOM_TEST_FLAG"), false);
  }
  test::ScopedEnv v("LOOM_TEST_FLAG", "yes");
  EXPECT_EQ(error_of([] { environment::flag("LOOM_TEST_FLAG"); }),
            "LOOM_TEST_FLAG='yes' is not valid (expected 0 or 1)");
}

TEST(Environment, IntegersNameTheirRange) {
  {
    test::ScopedEnv v("LOOM_TEST_INT", "7");
    EXPECT_EQ(environment::integer("LOOM_TEST_INT", 0, 1024), 7);
  }
  for (const char* bad : {"-1", "1025", "3.5", "x"}) {
    test::ScopedEnv v("LOOM_TEST_INT", bad);
    EXPECT_EQ(error_of([] { environment::integer("LOOM_TEST_INT", 0, 1024); }),
              std::string("LOOM_TEST_INT='") + bad +
                  "' is not valid (expected an integer from 0 to 1024)");
  }
}

TEST(Environment, TimeoutZeroDisablesAndHugeValuesAreCapped) {
  test::ScopedEnv no_loom_timeout_s("LOOM_TIMEOUT_S", nullptr);
  EXPECT_EQ(environment::timeout(), std::chrono::seconds(300));
  {
    test::ScopedEnv v("LOOM_TIMEOUT_S", "0");
    EXPECT_EQ(environment::timeout().count(), 0);
  }
  {
    test::ScopedEnv v("LOOM_TIMEOUT_S", "2.5");
    EXPECT_EQ(environment::timeout(), std::chrono::milliseconds(2500));
  }
  {
    test::ScopedEnv v("LOOM_TIMEOUT_S", "1e300");
    EXPECT_EQ(environment::timeout(), std::chrono::seconds(1'000'000'000));
  }
  EXPECT_EQ(error_of([] { environment::timeout_from_seconds(-1, "ExecutorOptions::timeout"); }),
            "ExecutorOptions::timeout must be >= 0 seconds (0 disables the watchdog)");
}

TEST(Environment, LauncherRanksComeFromTheLaunchersVariables) {
  test::ScopedEnv no_ompi_comm_world_local_rank("OMPI_COMM_WORLD_LOCAL_RANK", nullptr);
  test::ScopedEnv no_mpi_localrankid("MPI_LOCALRANKID", nullptr);
  test::ScopedEnv no_local_rank("LOCAL_RANK", nullptr);
  EXPECT_FALSE(environment::launcher_local_rank());
  test::ScopedEnv v("LOCAL_RANK", "3");
  EXPECT_EQ(environment::launcher_local_rank(), 3);
}

TEST(Environment, TheJobsSizeComesFromTheLaunchersVariablesAndIsACount) {
  test::ScopedEnv no_ompi_comm_world_size("OMPI_COMM_WORLD_SIZE", nullptr);
  test::ScopedEnv no_pmix_size("PMIX_SIZE", nullptr);
  test::ScopedEnv no_pmi_size("PMI_SIZE", nullptr);
  EXPECT_FALSE(environment::launcher_world_size());
  {
    test::ScopedEnv v("PMI_SIZE", "5");
    EXPECT_EQ(environment::launcher_world_size(), 5);
    test::ScopedEnv open_mpi("OMPI_COMM_WORLD_SIZE", "3");  // Open MPI's comes first
    EXPECT_EQ(environment::launcher_world_size(), 3);
  }
  test::ScopedEnv garbage("PMIX_SIZE", "4 ranks");  // not a count: ignored (atoi read 4)
  EXPECT_FALSE(environment::launcher_world_size());
}

// Each variable is documented once: README's "Environment" table has one row per variable,
// with the same meaning, default and values as environment::variables().
TEST(Environment, ReadmeTableMatchesTheVariables) {
  std::ifstream readme(LOOM_SOURCE_DIR "/README.md");
  ASSERT_TRUE(readme) << LOOM_SOURCE_DIR "/README.md";
  std::map<std::string, std::string> rows;
  std::string line;
  while (std::getline(readme, line))
    if (line.rfind("| `LOOM_", 0) == 0) rows[line.substr(3, line.find('`', 3) - 3)] = line;
  for (const auto& v : environment::variables()) {
    const std::string expected = "| `" + std::string(v.name) + "` | " + std::string(v.meaning) +
                                 " | " + std::string(v.default_value) + " | " +
                                 std::string(v.values) + " |";
    ASSERT_TRUE(rows.count(std::string(v.name))) << v.name << " has no row in README.md";
    EXPECT_EQ(rows[std::string(v.name)], expected);
    rows.erase(std::string(v.name));
  }
  for (const auto& [name, row] : rows)
    ADD_FAILURE() << "README.md documents " << name << ", which loom does not read: " << row;
}

}  // namespace
}  // namespace loom
