// ServerOptions registers its own flags (http/server.h): the listen flags and the limits,
// each bound to its field, with the field's value as the default and the range refused by
// the parser.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "http/server.h"

namespace strata::http {
namespace {

void parse(CLI::App& app, std::vector<std::string> args) {
  std::vector<const char*> argv{"test"};
  for (const auto& a : args) argv.push_back(a.c_str());
  app.parse(static_cast<int>(argv.size()), argv.data());
}

TEST(ServerFlagsTest, FlagsFillTheirFields) {
  ServerOptions o;
  CLI::App app{"test"};
  add_listen_flags(app, o);
  add_limit_flags(app, o);
  parse(app, {"--host", "0.0.0.0", "--port", "0", "--http-threads", "3", "--http-header-timeout-s",
              "1.5", "--http-max-body-bytes", "1024", "--http-max-connections", "7"});
  EXPECT_EQ(o.host, "0.0.0.0");
  EXPECT_EQ(o.port, 0);
  EXPECT_EQ(o.io_threads, 3);
  EXPECT_DOUBLE_EQ(o.header_timeout_s, 1.5);
  EXPECT_EQ(o.max_body_bytes, 1024);
  EXPECT_EQ(o.max_connections, 7);
  EXPECT_TRUE(validate(o));
}

TEST(ServerFlagsTest, DefaultsAreTheFieldsValues) {
  ServerOptions o;
  o.port = 8080;  // a command with another default port (strata route)
  CLI::App app{"test"};
  add_listen_flags(app, o);
  add_limit_flags(app, o);
  parse(app, {});
  EXPECT_EQ(o.port, 8080);
  const std::string help = app.help();
  EXPECT_NE(help.find("=8080"), std::string::npos) << help;
  EXPECT_NE(help.find("=127.0.0.1"), std::string::npos) << help;
  EXPECT_NE(help.find("=16384"), std::string::npos) << help;
}

TEST(ServerFlagsTest, OutOfRangeValuesAreRefused) {
  for (const auto& args :
       std::vector<std::vector<std::string>>{{"--port", "65536"},
                                             {"--http-threads", "2000"},
                                             {"--http-idle-timeout-s", "0"},
                                             {"--http-max-header-bytes", "100"},
                                             {"--http-max-stream-buffer-bytes", "10"}}) {
    ServerOptions o;
    CLI::App app{"test"};
    add_listen_flags(app, o);
    add_limit_flags(app, o);
    EXPECT_THROW(parse(app, args), CLI::ValidationError) << args[0];
  }
}

}  // namespace
}  // namespace strata::http
