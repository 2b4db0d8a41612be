#include "model/timing_profile.h"

#include <gtest/gtest.h>

#include "model/model_test_util.h"

#include <filesystem>
#include <fstream>
#include <string>

namespace strata {
namespace {

// A 2 x 2 prefill table and a 3 x 2 decode table with easy numbers.
std::string profile_json(const std::string& prefill_ms = "[[1, 3], [10, 30]]") {
  return R"({
    "format": "strata-timing-profile", "version": 1,
    "model": "tiny", "machine": "test", "source": "written by hand",
    "prefill": {"new_tokens": [1, 101], "context_tokens": [0, 1000], "ms": )" +
         prefill_ms + R"(},
    "decode": {"batch_size": [1, 2, 4], "context_tokens": [0, 100],
               "ms": [[2, 4], [3, 5], [5, 9]]}
  })";
}

TEST(TimingProfile, ParsesAndInterpolatesBilinearly) {
  auto p = TimingProfile::parse(profile_json());
  ASSERT_TRUE(p) << p.error().message;
  EXPECT_EQ(p->model, "tiny");
  EXPECT_EQ(p->machine, "test");
  // Grid points.
  EXPECT_DOUBLE_EQ(p->prefill_ms(1, 0), 1);
  EXPECT_DOUBLE_EQ(p->prefill_ms(101, 1000), 30);
  // Along one axis, then both.
  EXPECT_DOUBLE_EQ(p->prefill_ms(51, 0), 5.5);
  EXPECT_DOUBLE_EQ(p->prefill_ms(1, 500), 2);
  EXPECT_DOUBLE_EQ(p->prefill_ms(51, 500), (2.0 + 20.0) / 2);
  EXPECT_DOUBLE_EQ(p->decode_ms(3, 50), (4.0 + 7.0) / 2);
}

TEST(TimingProfile, ClampsBelowAndExtendsBeyondTheGrid) {
  auto p = TimingProfile::parse(profile_json());
  ASSERT_TRUE(p) << p.error().message;
  // Below the first point: the first point's value.
  EXPECT_DOUBLE_EQ(p->prefill_ms(0.5, -10), 1);
  // Beyond the last: the last segment's slope goes on (at context 0, 1 -> 10 ms over 100
  // new tokens: 19 ms at 201).
  EXPECT_DOUBLE_EQ(p->prefill_ms(201, 0), 19);
  EXPECT_DOUBLE_EQ(p->decode_ms(8, 0), 9);    // 3 -> 5 over 2 .. 4: +4 per 4 more
  EXPECT_DOUBLE_EQ(p->decode_ms(1, 200), 6);  // 2 -> 4 over 100 tokens
}

TEST(TimingProfile, AFallingLastSegmentStaysFlatBeyondIt) {
  auto p = TimingProfile::parse(profile_json("[[1, 3], [10, 8]]"));
  ASSERT_TRUE(p) << p.error().message;
  EXPECT_DOUBLE_EQ(p->prefill_ms(101, 5000), 8);
}

TEST(TimingProfile, RoundTripsThroughJson) {
  auto p = TimingProfile::parse(profile_json());
  ASSERT_TRUE(p);
  auto again = TimingProfile::parse(p->to_json());
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_EQ(again->prefill.ms, p->prefill.ms);
  EXPECT_EQ(again->decode.x, p->decode.x);
  EXPECT_EQ(again->source, p->source);
}

TEST(TimingProfile, RefusesBadProfilesNamingTheField) {
  struct Case {
    std::string text;
    std::string says;
  };
  std::string base = profile_json();
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = base;
    const size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return s.replace(at, from.size(), to);
  };
  const Case cases[] = {
      {"not json", "not valid JSON"},
      {"[1, 2]", "JSON object"},
      {with("strata-timing-profile", "other"), "format"},
      {with(R"("version": 1)", R"("version": 2)"), "version"},
      {with(R"("model": "tiny",)", ""), "model is missing"},
      {with(R"("model": "tiny")", R"("model": 3)"), "model must be a string"},
      {with(R"("new_tokens": [1, 101])", R"("new_tokens": [101, 1])"), "prefill.new_tokens"},
      {with(R"("new_tokens": [1, 101])", R"("new_tokens": [0, 101])"), "prefill.new_tokens"},
      {with(R"("batch_size": [1, 2, 4])", R"("batch_size": [])"), "decode.batch_size"},
      {with(R"("context_tokens": [0, 1000])", R"("context_tokens": [-1, 1000])"),
       "prefill.context_tokens"},
      {with("[[1, 3], [10, 30]]", "[[1, 3]]"), "prefill.ms must be an array of 2 rows"},
      {with("[[1, 3], [10, 30]]", "[[1, 3], [10]]"), "prefill.ms[1]"},
      {with("[[1, 3], [10, 30]]", "[[1, 3], [10, 0]]"), "prefill.ms[1]"},
      {with("[[1, 3], [10, 30]]", R"([[1, 3], [10, "x"]])"), "prefill.ms[1]"},
      {with(R"("decode": {)", R"("decoder": {)"), "decode is missing"},
  };
  for (const Case& c : cases) {
    auto p = TimingProfile::parse(c.text);
    ASSERT_FALSE(p) << c.text;
    EXPECT_EQ(p.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(p.error().message.find(c.says), std::string::npos)
        << "message: " << p.error().message << "\nwanted: " << c.says;
  }
}

TEST(TimingProfile, LoadNamesTheFile) {
  const auto dir = fresh_test_dir("timing_profile");
  const auto path = dir / "bad.json";
  std::ofstream(path) << "{}";
  auto p = TimingProfile::load(path);
  ASSERT_FALSE(p);
  EXPECT_NE(p.error().message.find(path.string()), std::string::npos);
  auto missing = TimingProfile::load(dir / "absent.json");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, ErrorCode::kNotFound);
}

TEST(TimingProfile, ShippedProfilesLoad) {
  for (const char* name : {"cpu-demo-qwen3.json", "h100-qwen3-8b.json"}) {
    auto p = TimingProfile::load(std::filesystem::path(STRATA_SOURCE_DIR) / "profiles" / name);
    EXPECT_TRUE(p) << name << ": " << p.error().message;
  }
}

}  // namespace
}  // namespace strata
