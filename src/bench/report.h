// What the scenarios write: the machine's description, aligned text tables for stdout and
// Markdown tables for docs, named checks with their verdict, number formatting, and files
// in the output folder.
//
// Pure functions apart from machine_info() (reads lscpu, /proc) and write_file(); all
// thread-safe.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"

namespace strata::bench {

// {"cpu_model", "cores", "memory_bytes", "kernel", "load_average"}: cpu_model is lscpu's
// "Model name", load_average the 1, 5 and 15 minute figures of /proc/loadavg.
nlohmann::ordered_json machine_info();
// "AMD EPYC, 2 cores": the line the docs name the machine with.
std::string machine_line(const nlohmann::ordered_json& machine);

struct Table {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
};

// Columns padded to their widest cell, separated by two spaces.
std::string to_text(const Table& t);
// A GitHub-flavoured Markdown table.
std::string to_markdown(const Table& t);

// A pass/fail verdict on one target; `detail` says what was measured against what.
struct Check {
  std::string name;
  bool passed = true;
  std::string detail;
};

nlohmann::ordered_json to_json(const std::vector<Check>& checks);
bool all_passed(const std::vector<Check>& checks);
// One line per check: "PASS name: detail".
std::string format_checks(const std::vector<Check>& checks);

std::string format_ms(double seconds);        // "421.5 ms"; "-" for NaN
std::string format_percent(double fraction);  // "93.1 %"; "-" for NaN
std::string format_ratio(double ratio);       // "11.1x"; "-" for NaN
std::string format_count(int64_t n);          // "15,002"

// Writes `content` to `path` (creating folders).
Status write_file(const std::filesystem::path& path, const std::string& content);
// Current UTC time as ISO 8601.
std::string utc_timestamp();

}  // namespace strata::bench
