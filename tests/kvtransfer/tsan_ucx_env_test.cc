// ThreadSanitizer builds only: UCM, UCX's memory-event library, interposes madvise and
// mmap as soon as it loads unless UCX_MEM_EVENTS=no is in the environment then (setting
// it later, or through ucm_set_global_opts, is too late). Its madvise hook runs inside
// glibc's thread teardown, where TSan's interceptors have no thread state and crash. tcp
// and shared memory need no memory events (they feed RDMA registration caches), so the
// test program re-executes itself once with the variable set, before any test runs.
// ASan and UBSan builds need nothing (docs/kv-transfer.md).
#if defined(__SANITIZE_THREAD__)

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace {

struct ReexecWithoutUcmEvents {
  ReexecWithoutUcmEvents() {
    if (std::getenv("UCX_MEM_EVENTS") != nullptr) return;
    std::ifstream in("/proc/self/cmdline", std::ios::binary);
    const std::string cmdline((std::istreambuf_iterator<char>(in)), {});
    std::vector<std::string> args;
    for (size_t at = 0; at < cmdline.size();) {
      const size_t end = cmdline.find('\0', at);
      args.push_back(cmdline.substr(at, end - at));
      at = end == std::string::npos ? cmdline.size() : end + 1;
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::setenv("UCX_MEM_EVENTS", "no", 1);
    ::execv("/proc/self/exe", argv.data());
    // execv failed: carry on; the UCX tests will show the crash this avoids.
  }
} reexec_without_ucm_events;

}  // namespace

#endif
