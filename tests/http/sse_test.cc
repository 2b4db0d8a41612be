// The server-sent-events splitter: the same events whatever the chunking, and its bound.
#include "http/sse.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace strata::http {
namespace {

std::vector<std::string> parse_all(const std::string& stream, size_t chunk,
                                   size_t max_event_bytes = SseParser::kDefaultMaxEventBytes) {
  SseParser p(max_event_bytes);
  std::vector<std::string> out;
  for (size_t i = 0; i < stream.size(); i += chunk) {
    auto st = p.feed(std::string_view(stream).substr(i, chunk),
                     [&](std::string_view d) { out.emplace_back(d); });
    if (!st) {
      out.push_back("<error>");
      break;
    }
  }
  return out;
}

TEST(SseTest, SameEventsWhateverTheChunking) {
  const std::string stream =
      ": a comment\n"
      "data: {\"a\":1}\n\n"
      "event: message\r\ndata: {\"b\":2}\r\n\r\n"
      "data: line one\ndata: line two\n\n"
      "id: 7\n\n"  // no data: no event
      "data\ndata:  two spaces\n\n"
      "data:[DONE]\n\n";
  const std::vector<std::string> want = {"{\"a\":1}", "{\"b\":2}", "line one\nline two",
                                         "\n two spaces", "[DONE]"};
  for (size_t chunk : {1, 2, 3, 7, 1000}) EXPECT_EQ(parse_all(stream, chunk), want) << chunk;
}

TEST(SseTest, AnUnfinishedEventIsNotDelivered) {
  SseParser p;
  int events = 0;
  ASSERT_TRUE(p.feed("data: {\"a\":1}\n", [&](std::string_view) { ++events; }));
  EXPECT_EQ(events, 0);
  EXPECT_TRUE(p.mid_event());
  ASSERT_TRUE(p.feed("\n", [&](std::string_view) { ++events; }));
  EXPECT_EQ(events, 1);
  EXPECT_FALSE(p.mid_event());
}

TEST(SseTest, LinesAndEventsAreBounded) {
  // Lines (field name included) and an event's joined data hold at most the bound: exactly
  // at it is fine; one byte over fails, and the parser stays failed.
  EXPECT_EQ(parse_all("data: 0123456789\n\n", 3, 16), std::vector<std::string>{"0123456789"});
  EXPECT_EQ(parse_all("data: 01234567890\n\n", 3, 16).back(), "<error>");
  EXPECT_EQ(parse_all("data: 12345678\ndata: 12345678\n\n", 100, 16).back(), "<error>");
  EXPECT_EQ(parse_all(std::string(100, 'x'), 7, 64).back(), "<error>");  // a line never ends
  SseParser p(8);
  const auto none = [](std::string_view) {};
  EXPECT_FALSE(p.feed("data: 123456789\n", none));
  auto again = p.feed("data: 1\n\n", none);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code, ErrorCode::kResourceExhausted);
}

}  // namespace
}  // namespace strata::http
