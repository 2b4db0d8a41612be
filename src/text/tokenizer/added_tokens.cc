#include "text/tokenizer/added_tokens.h"

namespace strata {

AddedTokenSplitter::AddedTokenSplitter(const std::vector<AddedToken>& tokens)
    : nodes_(1), root_children_(256, -1) {
  token_sizes_.reserve(tokens.size());
  for (size_t t = 0; t < tokens.size(); ++t) {
    const std::string& content = tokens[t].content;
    token_sizes_.push_back(static_cast<uint32_t>(content.size()));
    if (content.empty()) continue;  // never matches in the reference either
    int32_t node = 0;
    for (const char ch : content) {
      const auto byte = static_cast<uint8_t>(ch);
      int32_t next = child(node, byte);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_.emplace_back();
        if (node == 0) {
          root_children_[byte] = next;
        } else {
          nodes_[node].children.emplace_back(byte, next);
        }
      }
      node = next;
    }
    nodes_[node].token = static_cast<int32_t>(t);
  }
}

int32_t AddedTokenSplitter::child(int32_t node, uint8_t byte) const {
  if (node == 0) return root_children_[byte];
  for (const auto& [b, next] : nodes_[node].children) {
    if (b == byte) return next;
  }
  return -1;
}

void AddedTokenSplitter::split(std::string_view text, std::vector<Section>& out) const {
  const size_t n = text.size();
  size_t start = 0;
  size_t i = 0;
  while (i < n) {
    int32_t node = root_children_[static_cast<uint8_t>(text[i])];
    if (node < 0) {
      ++i;
      continue;
    }
    int32_t match = -1;
    for (size_t j = i + 1;; ++j) {
      if (nodes_[node].token >= 0) match = nodes_[node].token;
      if (j >= n) break;
      node = child(node, static_cast<uint8_t>(text[j]));
      if (node < 0) break;
    }
    if (match < 0) {
      ++i;
      continue;
    }
    if (i > start) out.push_back(Section{text.substr(start, i - start), -1});
    out.push_back(Section{text.substr(i, token_sizes_[match]), match});
    i += token_sizes_[match];
    start = i;
  }
  if (start < n) out.push_back(Section{text.substr(start), -1});
}

}  // namespace strata
