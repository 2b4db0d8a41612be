#include "common/result.h"

#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <utility>

namespace strata {
namespace {

Result<int> parse_digit(char c) {
  if (c < '0' || c > '9') {
    return make_error(ErrorCode::kInvalidArgument, std::string("not a digit: ") + c);
  }
  return c - '0';
}

Status require_even(int v) {
  if (v % 2 != 0) return make_error(ErrorCode::kFailedPrecondition, "odd");
  return {};
}

TEST(ResultTest, CarriesAValueOrAnError) {
  const Result<int> ok = parse_digit('7');
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(*ok, 7);

  const Result<int> bad = parse_digit('x');
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(bad.error().message, "not a digit: x");
}

TEST(ResultTest, StatusIsAResultWithoutAValue) {
  EXPECT_TRUE(require_even(4));
  const Status odd = require_even(3);
  ASSERT_FALSE(odd);
  EXPECT_EQ(odd.error().code, ErrorCode::kFailedPrecondition);
  EXPECT_EQ(odd.error().message, "odd");
}

// The house pattern: a caller returns the first failure as is, with its code and message.
Result<int> sum_of_digits(std::string_view text) {
  int sum = 0;
  for (char c : text) {
    auto digit = parse_digit(c);
    if (!digit) return std::unexpected(digit.error());
    sum += *digit;
  }
  return sum;
}

TEST(ResultTest, AFailurePropagatesUnchanged) {
  auto ok = sum_of_digits("123");
  ASSERT_TRUE(ok);
  EXPECT_EQ(*ok, 6);
  auto failed = sum_of_digits("1?3");
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(failed.error().message, "not a digit: ?");
  EXPECT_EQ(sum_of_digits("").value_or(-1), 0);
  EXPECT_EQ(sum_of_digits("x").value_or(-1), -1);
}

TEST(ResultTest, HoldsMoveOnlyValues) {
  Result<std::unique_ptr<int>> r = std::make_unique<int>(5);
  ASSERT_TRUE(r);
  std::unique_ptr<int> taken = std::move(*r);
  EXPECT_EQ(*taken, 5);
}

TEST(ResultTest, ADefaultErrorIsInternal) {
  const Error e;
  EXPECT_EQ(e.code, ErrorCode::kInternal);
  EXPECT_TRUE(e.message.empty());
}

// The names are the `error.code` strings of HTTP answers (docs/architecture.md's table):
// each code has its own, and none falls through to "unknown".
TEST(ResultTest, EveryErrorCodeHasItsOwnName) {
  const std::pair<ErrorCode, std::string_view> expected[] = {
      {ErrorCode::kInvalidArgument, "invalid_argument"},
      {ErrorCode::kNotFound, "not_found"},
      {ErrorCode::kOutOfPages, "out_of_pages"},
      {ErrorCode::kResourceExhausted, "resource_exhausted"},
      {ErrorCode::kFailedPrecondition, "failed_precondition"},
      {ErrorCode::kOverBudget, "pin_budget_exceeded"},
      {ErrorCode::kStaleEpoch, "stale_epoch"},
      {ErrorCode::kBusy, "session_busy"},
      {ErrorCode::kNoHostTier, "no_host_tier"},
      {ErrorCode::kUnauthenticated, "unauthenticated"},
      {ErrorCode::kIoError, "io_error"},
      {ErrorCode::kCorrupt, "corrupt"},
      {ErrorCode::kTimeout, "timeout"},
      {ErrorCode::kUnsupported, "unsupported"},
      {ErrorCode::kInternal, "internal"},
  };
  std::set<std::string_view> names;
  for (const auto& [code, name] : expected) {
    EXPECT_EQ(error_code_name(code), name);
    names.insert(error_code_name(code));
  }
  EXPECT_EQ(names.size(), std::size(expected));
  EXPECT_EQ(error_code_name(static_cast<ErrorCode>(1000)), "unknown");
}

}  // namespace
}  // namespace strata
