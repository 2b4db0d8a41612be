#include "common/log.h"

#include <gtest/gtest.h>

#include <utility>

namespace strata {
namespace {

// Restores the process-wide level after each test.
class LogLevelTest : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = spdlog::get_level(); }
  void TearDown() override { spdlog::set_level(saved_); }

 private:
  spdlog::level::level_enum saved_ = spdlog::level::info;
};

TEST_F(LogLevelTest, EveryNamedLevelIsSet) {
  const std::pair<const char*, spdlog::level::level_enum> levels[] = {
      {"trace", spdlog::level::trace},  {"debug", spdlog::level::debug},
      {"info", spdlog::level::info},    {"warn", spdlog::level::warn},
      {"warning", spdlog::level::warn}, {"error", spdlog::level::err},
      {"off", spdlog::level::off},
  };
  for (const auto& [name, level] : levels) {
    spdlog::set_level(spdlog::level::critical);
    EXPECT_TRUE(set_log_level(name)) << name;
    EXPECT_EQ(spdlog::get_level(), level) << name;
  }
}

TEST_F(LogLevelTest, AnUnknownNameIsRefusedAndChangesNothing) {
  spdlog::set_level(spdlog::level::warn);
  for (const char* name : {"", "INFO", "verbose", "err", "info ", "critical"}) {
    EXPECT_FALSE(set_log_level(name)) << '"' << name << '"';
    EXPECT_EQ(spdlog::get_level(), spdlog::level::warn) << '"' << name << '"';
  }
}

TEST_F(LogLevelTest, DebugLinesFollowTheLevel) {
  ASSERT_TRUE(set_log_level("info"));
  EXPECT_FALSE(spdlog::should_log(spdlog::level::debug));
  ASSERT_TRUE(set_log_level("debug"));
  EXPECT_TRUE(spdlog::should_log(spdlog::level::debug));
  STRATA_LOG_DEBUG("a debug line with an argument: {}", 1);  // compiles and runs
}

}  // namespace
}  // namespace strata
