// Added tokens (tokenizer.json "added_tokens"): matched in the raw input before
// normalization and never split, the way the reference does it: a trie over all added
// token contents finds, scanning left to right, the longest token starting at each
// position (DictionarySplitter). The reference ignores `single_word` and `normalized` and
// matches every added token, special or not, on the raw text; Strata does the same.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "text/tokenizer/bpe_model.h"

namespace strata {

struct AddedToken {
  std::string content;
  TokenId id = 0;
  bool single_word = false;
  bool lstrip = false;  // strip JS whitespace from the end of the text before it
  bool rstrip = false;  // strip JS whitespace from the start of the text after it
  bool normalized = false;
  bool special = false;
};

class AddedTokenSplitter {
 public:
  // A piece of the input: plain text (token < 0) or an added token (index into the vector
  // given to the constructor; with duplicate contents, the last one).
  struct Section {
    std::string_view text;
    int32_t token = -1;
  };

  explicit AddedTokenSplitter(const std::vector<AddedToken>& tokens);

  // Splits `text` into sections, appending them to `out` (plain sections are non-empty).
  void split(std::string_view text, std::vector<Section>& out) const;

  bool empty() const { return nodes_.size() == 1; }

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // byte -> node
    int32_t token = -1;                                 // a token ends here
  };
  int32_t child(int32_t node, uint8_t byte) const;

  std::vector<Node> nodes_;             // nodes_[0] is the root
  std::vector<int32_t> root_children_;  // 256 entries, -1 when absent
  std::vector<uint32_t> token_sizes_;
};

}  // namespace strata
