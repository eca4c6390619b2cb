// open_output_file / close_output_file: every file loom writes is opened, or refused with the
// file's name, what it is and the system's reason.
#include "loom/output_file.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "loom/error.hpp"

namespace loom {
namespace {

TEST(OutputFile, AMissingDirectoryIsRefusedWithTheSystemsReason) {
  try {
    open_output_file("/nonexistent-dir/graph.dot", "DOT file");
    FAIL() << "opened a file in a missing directory";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_STREQ(e.what(),
                 "[loom:invalid_argument] cannot write the DOT file '/nonexistent-dir/graph.dot': "
                 "No such file or directory");
  }
}

TEST(OutputFile, AFailedWriteIsRefusedWhenTheFileIsClosed) {
  // /dev/full takes the open and refuses every write with ENOSPC.
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full on this system";
  {  // refused when close() flushes the buffer: the system's reason
    std::ofstream out = open_output_file("/dev/full", "tuning file");
    out << "alpha_us 5\n";
    try {
      close_output_file(out, "/dev/full", "tuning file");
      FAIL() << "a write to /dev/full was not refused";
    } catch (const Error& e) {
      EXPECT_STREQ(e.what(),
                   "[loom:invalid_argument] cannot write the tuning file '/dev/full': No space "
                   "left on device");
    }
  }
  {  // refused while writing (the buffer filled): refused at close, without a stale reason
    std::ofstream out = open_output_file("/dev/full", "tuning file");
    out << std::string(1 << 20, 'x');
    try {
      close_output_file(out, "/dev/full", "tuning file");
      FAIL() << "a write to /dev/full was not refused";
    } catch (const Error& e) {
      EXPECT_STREQ(e.what(),
                   "[loom:invalid_argument] cannot write the tuning file '/dev/full': a write to "
                   "it failed");
    }
  }
}

TEST(OutputFile, AWritableFileIsWrittenAndClosed) {
  const auto path = std::filesystem::temp_directory_path() / "loom_output_file_test.txt";
  {
    std::ofstream out = open_output_file(path.string(), "step profile");
    out << "loom\n";
    close_output_file(out, path.string(), "step profile");
  }
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "loom");
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace loom
