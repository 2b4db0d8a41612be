// The cache dashboard's static assets, embedded in the binary at build time: every file of
// src/dashboard ending in .html, .js, .css or .svg, d3 (tools/js/node_modules/d3, vendored
// by scripts/install-deps.sh) as d3.min.js and its licence as d3-LICENSE.txt. Nothing is
// loaded from the internet: the page works offline. The build embeds them again whenever
// one changes (CMakeLists.txt, embed_assets.cmake).
//
// Names are plain file names looked up in this table only: no path reaches the file
// system from a request, so "../x" or "a/b" is simply unknown.
//
// Development aid: with the environment variable STRATA_DASHBOARD_DIR set (read once, at
// the first lookup), the page's own files are read from that directory at each request
// instead of the embedded copies, so that editing the page needs no rebuild (a reload
// shows it). d3 and its licence stay embedded. A file added there after start-up is not
// served until a restart (the routes are fixed then).
//
// Threads: everything here may be called from any thread; the table is built once.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace strata::dashboard {

// One asset as served.
struct Asset {
  std::string content_type;  // with "; charset=utf-8" for text
  std::string etag;          // strong validator, quoted: a hash of the bytes
  std::string body;
};

// The asset named `name` (e.g. "index.html", "d3.min.js"), from STRATA_DASHBOARD_DIR when
// set (page files) or the embedded table; nullopt for an unknown name.
std::optional<Asset> find_asset(std::string_view name);

// Every servable name, sorted: the embedded ones, plus with STRATA_DASHBOARD_DIR the
// page files found there now.
std::vector<std::string> asset_names();

// The names compiled in (no override), sorted.
std::vector<std::string> embedded_asset_names();

// The content type for a name, by extension (html, js, css, svg, png, json, txt); ""
// for any other (such a name is never an asset).
std::string_view content_type_for(std::string_view name);

// Whether `name` is a plain file name with a known extension: letters, digits, '.', '_'
// and '-', not starting with '.'.
bool valid_asset_name(std::string_view name);

// Whether a request's If-None-Match header (a list of entity tags, or "*") matches `etag`
// (weak comparison, as RFC 9110 §13.1.2 asks of GET).
bool etag_matches(std::string_view if_none_match, std::string_view etag);

// Strata's version, as `strata --version` prints it (for /dashboard/config).
std::string_view strata_version();

}  // namespace strata::dashboard
