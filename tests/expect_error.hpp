// expect_error(code, text, bad): `bad` must throw loom::Error with `code` and a message that
// contains `text`, the fragment naming what was wrong (the value, the node, the rank, the sizes).
// EXPECT_THROW(..., Error) passes for any loom error, including one about something else.
// Shared by the tests of bad input; a failure is reported at the caller's line.
#pragma once

#include <gtest/gtest.h>

#include <source_location>
#include <string>
#include <utility>

#include "loom/error.hpp"

namespace loom::test {

template <class Bad>
void expect_error(ErrorCode code, const std::string& text, Bad&& bad,
                  std::source_location where = std::source_location::current()) {
  const ::testing::ScopedTrace trace(
      where.file_name(), static_cast<int>(where.line()),
      "expect_error(" + std::string(to_string(code)) + ", '" + text + "')");
  try {
    std::forward<Bad>(bad)();
    ADD_FAILURE() << "no error; expected " << to_string(code) << " containing '" << text << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_TRUE(e.message().find(text) != std::string::npos)
        << "expected '" << text << "' in: " << e.what();
  }
}

}  // namespace loom::test
