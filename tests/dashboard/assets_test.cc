// The dashboard's embedded assets: the table holds exactly the page's files and d3 as they
// are on disk, content types and ETags, lookups that refuse anything but a plain known
// name, the answers (200, 304, 404), and the STRATA_DASHBOARD_DIR override.
#include "dashboard/assets.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include "dashboard/dashboard_routes.h"

namespace strata::dashboard {
namespace {

namespace fs = std::filesystem;

std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  EXPECT_TRUE(f) << p;
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

const fs::path kSource = STRATA_SOURCE_DIR;

std::string header(const http::Response& r, std::string_view name) {
  for (const auto& [k, v] : r.headers) {
    if (http::iequals(k, name)) return v;
  }
  return {};
}

TEST(DashboardAssets, EmbedsThePageFilesAndD3AsOnDisk) {
  std::set<std::string> expected{"d3.min.js", "d3-LICENSE.txt"};
  for (const auto& e : fs::directory_iterator(kSource / "src/dashboard")) {
    const std::string ext = e.path().extension().string();
    if (ext == ".html" || ext == ".js" || ext == ".css" || ext == ".svg") {
      expected.insert(e.path().filename().string());
    }
  }
  const std::vector<std::string> names = embedded_asset_names();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), expected)
      << "rebuild: the build embeds the files again when they change";
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  for (const std::string& name : names) {
    fs::path path = kSource / "src/dashboard" / name;
    if (name == "d3.min.js") path = kSource / "tools/js/node_modules/d3/dist/d3.min.js";
    if (name == "d3-LICENSE.txt") path = kSource / "tools/js/node_modules/d3/LICENSE";
    auto a = find_asset(name);
    ASSERT_TRUE(a) << name;
    EXPECT_EQ(a->body, read(path)) << name;
  }
}

TEST(DashboardAssets, ContentTypesByExtension) {
  EXPECT_EQ(content_type_for("index.html"), "text/html; charset=utf-8");
  EXPECT_EQ(content_type_for("d3.min.js"), "text/javascript; charset=utf-8");
  EXPECT_EQ(content_type_for("dashboard.css"), "text/css; charset=utf-8");
  EXPECT_EQ(content_type_for("logo.svg"), "image/svg+xml");
  EXPECT_EQ(content_type_for("shot.png"), "image/png");
  EXPECT_EQ(content_type_for("data.json"), "application/json");
  EXPECT_EQ(content_type_for("d3-LICENSE.txt"), "text/plain; charset=utf-8");
  EXPECT_EQ(content_type_for("x.exe"), "");
  EXPECT_EQ(content_type_for(".js"), "");  // an extension alone is no name
  EXPECT_EQ(content_type_for("README"), "");
  auto d3 = find_asset("d3.min.js");
  ASSERT_TRUE(d3);
  EXPECT_EQ(d3->content_type, "text/javascript; charset=utf-8");
  auto license = find_asset("d3-LICENSE.txt");
  ASSERT_TRUE(license);
  EXPECT_NE(license->body.find("Mike Bostock"), std::string::npos);
}

TEST(DashboardAssets, OnlyPlainKnownNamesAreFound) {
  for (const char* bad :
       {"", "../x", "../d3.min.js", "..", ".", "a/b.js", "/etc/passwd", "..%2Fd3.min.js",
        ".hidden.js", "d3.min.js/", "x\\y.js", "nope.js", "index.htm", "d3.min.js.map"}) {
    EXPECT_FALSE(find_asset(bad)) << bad;
  }
  EXPECT_FALSE(valid_asset_name("../x"));
  EXPECT_FALSE(valid_asset_name("a/b.js"));
  EXPECT_FALSE(valid_asset_name(".x.js"));
  EXPECT_FALSE(valid_asset_name(std::string(200, 'a') + ".js"));
  EXPECT_FALSE(valid_asset_name(std::string_view("a\0.js", 5)));
  EXPECT_TRUE(valid_asset_name("d3-LICENSE.txt"));
  EXPECT_TRUE(valid_asset_name("index.html"));
}

TEST(DashboardAssets, ETagsAreQuotedStableAndPerContent) {
  auto a = find_asset("d3.min.js");
  auto b = find_asset("d3.min.js");
  auto c = find_asset("d3-LICENSE.txt");
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(a->etag, b->etag);
  EXPECT_NE(a->etag, c->etag);
  ASSERT_GE(a->etag.size(), 3U);
  EXPECT_EQ(a->etag.front(), '"');
  EXPECT_EQ(a->etag.back(), '"');
}

TEST(DashboardAssets, IfNoneMatch) {
  const std::string tag = "\"0123456789abcdef\"";
  EXPECT_TRUE(etag_matches(tag, tag));
  EXPECT_TRUE(etag_matches("W/" + tag, tag));  // weak comparison for GET
  EXPECT_TRUE(etag_matches("\"other\", " + tag, tag));
  EXPECT_TRUE(etag_matches(" * ", tag));
  EXPECT_FALSE(etag_matches("", tag));
  EXPECT_FALSE(etag_matches("\"other\"", tag));
  EXPECT_FALSE(etag_matches("0123456789abcdef", tag));  // unquoted: another tag
  EXPECT_FALSE(etag_matches(",,", tag));
}

TEST(DashboardAssets, Answers) {
  http::Request req;
  req.method = "GET";
  http::Response ok = asset_response(req, "d3.min.js");
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(ok.content_type, "text/javascript; charset=utf-8");
  EXPECT_EQ(header(ok, "Cache-Control"), "no-cache");
  const std::string etag = header(ok, "ETag");
  EXPECT_EQ(etag, find_asset("d3.min.js")->etag);
  EXPECT_GT(ok.body.size(), 100'000U);

  req.headers.emplace_back("if-none-match", etag);
  http::Response same = asset_response(req, "d3.min.js");
  EXPECT_EQ(same.status, 304);
  EXPECT_TRUE(same.body.empty());
  EXPECT_EQ(header(same, "ETag"), etag);

  req.headers = {{"If-None-Match", "\"stale\""}};
  EXPECT_EQ(asset_response(req, "d3.min.js").status, 200);

  http::Response missing = asset_response(req, "../secret.js");
  EXPECT_EQ(missing.status, 404);
  EXPECT_NE(missing.body.find("not_found"), std::string::npos);
}

TEST(DashboardAssets, VersionIsTheProjects) {
  EXPECT_FALSE(strata_version().empty());
  EXPECT_NE(strata_version().find('.'), std::string_view::npos);
}

// STRATA_DASHBOARD_DIR is read once per process: each case runs in a fresh child
// ("threadsafe" death tests re-run the binary for the one test).
TEST(DashboardAssetsDeathTest, DevelopmentDirectoryOverridesThePageButNotD3) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // A fixed name: the child runs this function again from the start.
  const fs::path dir = fs::temp_directory_path() / "strata-dashboard-assets-test";
  fs::create_directories(dir);
  std::ofstream(dir / "index.html") << "<p>dev</p>";
  std::ofstream(dir / "extra.js") << "1;";
  std::ofstream(dir / "d3.min.js") << "not d3";
  std::ofstream(dir / "notes.md") << "no";
  EXPECT_EXIT(
      {
        ::setenv("STRATA_DASHBOARD_DIR", dir.c_str(), 1);
        bool ok = find_asset("index.html")->body == "<p>dev</p>";
        ok = ok && find_asset("extra.js")->body == "1;";
        ok = ok && find_asset("d3.min.js")->body.size() > 100'000;  // still embedded
        ok = ok && !find_asset("notes.md");
        const std::vector<std::string> names = asset_names();
        ok = ok && std::find(names.begin(), names.end(), "extra.js") != names.end();
        ok = ok && std::find(names.begin(), names.end(), "notes.md") == names.end();
        // Edits show at the next request, with a new ETag.
        const std::string before = find_asset("index.html")->etag;
        std::ofstream(dir / "index.html") << "<p>edited</p>";
        ok = ok && find_asset("index.html")->body == "<p>edited</p>" &&
             find_asset("index.html")->etag != before;
        std::exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace strata::dashboard
