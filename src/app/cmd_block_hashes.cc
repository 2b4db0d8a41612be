// `strata block-hashes`: prints the block hashes of a token sequence, as the cache
// computes them (either algorithm), so that a router or a test can check its own
// implementation.
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "cache/block_hash.h"
#include "engine/engine_options.h"

namespace strata::app {

void add_block_hashes_command(CLI::App& app, int& exit_code) {
  struct Options {
    int page_size = 16;
    std::string salt;
    std::string algo = "strata";
    std::string seed;
    std::vector<int64_t> tokens;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "block-hashes", "Print the chained block hashes of a token id sequence (JSON, signed int64)");
  cmd->add_option("--page-size", opts->page_size, "Tokens per page")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--cache-salt", opts->salt, "Tenant salt entering the first page's extra keys");
  cmd->add_option("--prefix-caching-hash-algo", opts->algo,
                  "strata (the cache's own) | sha256_cbor (vLLM's, as `serve` with this flag)")
      ->capture_default_str();
  cmd->add_option("--prefix-caching-hash-seed", opts->seed,
                  "sha256_cbor's seed, vLLM's PYTHONHASHSEED (default: this process's)");
  cmd->add_option("tokens", opts->tokens, "Token ids")->required();
  cmd->callback([opts, &exit_code] {
    std::vector<TokenId> tokens;
    for (int64_t t : opts->tokens) {
      if (t < 0 || t > INT32_MAX) {
        std::cerr << "strata block-hashes: token id out of range: " << t << "\n";
        exit_code = 2;
        return;
      }
      tokens.push_back(static_cast<TokenId>(t));
    }
    auto algo = parse_block_hash_algo(opts->algo);
    if (!algo) {
      std::cerr << "strata block-hashes: " << algo.error().message << "\n";
      exit_code = 2;
      return;
    }
    EngineOptions eo;  // the seed resolved as `serve` resolves it (block_hasher_for)
    eo.prefix_caching_hash_algo = *algo;
    eo.prefix_caching_hash_seed = opts->seed;
    auto hasher = block_hasher_for(eo);
    if (!hasher) {
      std::cerr << "strata block-hashes: " << hasher.error().message << "\n";
      exit_code = 2;
      return;
    }
    nlohmann::json out = nlohmann::json::array();
    for (BlockHash h : hasher->hash_blocks(tokens, opts->page_size, opts->salt)) {
      out.push_back(block_hash_to_wire(h));
    }
    std::cout << nlohmann::json{{"page_size", opts->page_size}, {"block_hashes", out}}.dump()
              << "\n";
    exit_code = 0;
  });
}

}  // namespace strata::app
