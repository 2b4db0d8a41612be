#include "common/check.h"

#include <gtest/gtest.h>

#include <string>

namespace strata {
namespace {

TEST(CheckTest, APassingCheckDoesNothing) {
  int evaluated = 0;
  STRATA_CHECK(1 + 1 == 2);
  // The message is built only when the check fails.
  STRATA_CHECK_MSG(true, (++evaluated, std::string("never built")));
  EXPECT_EQ(evaluated, 0);
}

TEST(CheckTest, TheConditionIsEvaluatedOnce) {
  int calls = 0;
  auto once = [&] { return ++calls == 1; };
  STRATA_CHECK(once());
  EXPECT_EQ(calls, 1);
}

TEST(CheckDeathTest, AFailedCheckReportsFileLineAndConditionThenAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const int pages = 3;
  EXPECT_DEATH(STRATA_CHECK(pages == 4), "check failed at .*check_test\\.cc:[0-9]+: pages == 4");
}

TEST(CheckDeathTest, AFailedCheckCarriesItsMessage) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const int page = 7;
  EXPECT_DEATH(STRATA_CHECK_MSG(page < 0, "double free of page " + std::to_string(page)),
               "page < 0: double free of page 7");
}

}  // namespace
}  // namespace strata
