// The table the build generates (embed_assets.cmake): the dashboard's files as they were
// when the binary was built, in name order. Read through assets.h, which adds content
// types, ETags and the development override.
#pragma once

#include <cstddef>

namespace strata::dashboard {

struct EmbeddedFile {
  const char* name;            // served as /dashboard/<name>
  const unsigned char* bytes;  // static storage; size bytes (a 0 follows them)
  size_t size;
};

extern const EmbeddedFile kEmbeddedFiles[];
extern const size_t kNumEmbeddedFiles;

}  // namespace strata::dashboard
