#include "bench/report.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <fstream>
#include <sstream>
#include <thread>

#include "bench/server_process.h"

namespace strata::bench {

namespace {

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  const auto e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// The value of "key: value" lines (lscpu, /proc/cpuinfo).
std::string field(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    if (trim(line.substr(0, colon)) == key) return trim(line.substr(colon + 1));
  }
  return {};
}

}  // namespace

nlohmann::ordered_json machine_info() {
  std::string cpu = field(command_output("LC_ALL=C lscpu 2>/dev/null"), "Model name");
  if (cpu.empty()) {
    std::ifstream in("/proc/cpuinfo");
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    cpu = field(all, "model name");
  }
  utsname u{};
  ::uname(&u);
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  // The load when the run started: the machine may be shared, which inflates times.
  std::ifstream loadavg("/proc/loadavg");
  double load1 = 0, load5 = 0, load15 = 0;
  loadavg >> load1 >> load5 >> load15;
  return nlohmann::ordered_json{{"cpu_model", cpu.empty() ? "unknown" : cpu},
                                {"cores", std::thread::hardware_concurrency()},
                                {"memory_bytes", static_cast<int64_t>(pages) * page},
                                {"kernel", std::string(u.sysname) + " " + u.release},
                                {"load_average", {load1, load5, load15}}};
}

std::string machine_line(const nlohmann::ordered_json& m) {
  return m.value("cpu_model", std::string("unknown CPU")) + ", " +
         std::to_string(m.value("cores", 0)) + " cores";
}

std::string to_text(const Table& t) {
  std::vector<size_t> width(t.header.size(), 0);
  auto widen = [&](const std::vector<std::string>& row) {
    for (size_t i = 0; i < row.size() && i < width.size(); ++i) {
      width[i] = std::max(width[i], row[i].size());
    }
  };
  widen(t.header);
  for (const auto& r : t.rows) widen(r);
  auto line = [&](const std::vector<std::string>& row) {
    std::string s;
    for (size_t i = 0; i < width.size(); ++i) {
      const std::string cell = i < row.size() ? row[i] : "";
      if (i > 0) s += "  ";
      s += i == 0 ? cell + std::string(width[i] - cell.size(), ' ')
                  : std::string(width[i] - cell.size(), ' ') + cell;
    }
    while (!s.empty() && s.back() == ' ') s.pop_back();
    return s + "\n";
  };
  std::string out = line(t.header);
  size_t total = 0;
  for (size_t w : width) total += w;
  out += std::string(total + 2 * (width.empty() ? 0 : width.size() - 1), '-') + "\n";
  for (const auto& r : t.rows) out += line(r);
  return out;
}

std::string to_markdown(const Table& t) {
  auto line = [](const std::vector<std::string>& row) {
    std::string s = "|";
    for (const std::string& c : row) s += " " + c + " |";
    return s + "\n";
  };
  std::string out = line(t.header);
  out += "|";
  for (size_t i = 0; i < t.header.size(); ++i) out += i == 0 ? "---|" : "---:|";
  out += "\n";
  for (const auto& r : t.rows) out += line(r);
  return out;
}

nlohmann::ordered_json to_json(const std::vector<Check>& checks) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const Check& c : checks) {
    out.push_back({{"name", c.name}, {"passed", c.passed}, {"detail", c.detail}});
  }
  return out;
}

bool all_passed(const std::vector<Check>& checks) {
  return std::all_of(checks.begin(), checks.end(), [](const Check& c) { return c.passed; });
}

std::string format_checks(const std::vector<Check>& checks) {
  std::string out;
  for (const Check& c : checks) {
    out += std::string(c.passed ? "PASS " : "FAIL ") + c.name + ": " + c.detail + "\n";
  }
  return out;
}

std::string format_ms(double seconds) {
  if (!std::isfinite(seconds)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f ms", seconds * 1000);
  return buf;
}

std::string format_percent(double fraction) {
  if (!std::isfinite(fraction)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f %%", fraction * 100);
  return buf;
}

std::string format_ratio(double ratio) {
  if (!std::isfinite(ratio)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1fx", ratio);
  return buf;
}

std::string format_count(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

Status write_file(const std::filesystem::path& path, const std::string& content) {
  std::error_code ec;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
  out.close();
  if (!out) return make_error(ErrorCode::kIoError, "cannot write " + path.string());
  return {};
}

std::string utc_timestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace strata::bench
