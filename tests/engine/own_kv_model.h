// The CPU model with its KV in a pool of its own, as the GPU model keeps its pages in GPU
// memory (ForwardModel::external_kv, cuda/gpu_model.h): the engine's pool only counts pages,
// and every byte between the model's memory and the host goes through copy devices the
// model hands out (tests/memory/fake_copy_device.h, landing by themselves). So the GPU's
// tier and P/D paths run without a GPU (external_kv_test.cc, pd_engine/pd_stage_test.cc).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <span>
#include <vector>

#include "../memory/fake_copy_device.h"
#include "engine/engine.h"
#include "engine/engine_test_access.h"
#include "model/forward_model.h"
#include "model/model.h"

namespace strata {

class OwnKvModel final : public ForwardModel {
 public:
  OwnKvModel(std::unique_ptr<Model> inner, int32_t num_pages, int32_t page_size)
      : inner_(std::move(inner)), num_pages_(num_pages) {
    own_ = std::make_unique<KvPool>(inner_->kv_pool_shape(num_pages, page_size, KvDtype::kF32));
  }

  const ModelConfig& config() const override { return inner_->config(); }
  // Pages counted only, as the GPU model's.
  KvPoolShape kv_pool_shape(int32_t num_pages, int32_t page_size, KvDtype dtype) const override {
    return KvPoolShape{1, 1, 2, num_pages, page_size, dtype};
  }
  Status forward(std::span<const ForwardSequence> batch, KvPool& pool,
                 ForwardOutput& out) override {
    if (pool.num_pages() != num_pages_ || pool.num_layers() != 1) {
      return bad_argument("not the counting pool");
    }
    if (auto st = inner_->forward(batch, *own_, out); !st) return st;
    // As a GPU does (ForwardOutput::sampled): a row with sampling is drawn here, by the
    // Sampler's rules and the row's number (sample_row), and comes back as a token, its
    // logits garbage (NaN, so a reader would show). With fallback_every_ = n, every n-th such
    // row is left to the engine (token -1), as a device that cannot draw a row does.
    if (sample_ && !out.logits.empty()) {
      const auto vocab = static_cast<size_t>(config().vocab_size);
      size_t r = 0;
      for (const ForwardSequence& f : batch) {
        if (!f.want_logits) continue;
        const std::span<float> row(out.logits.data() + r * vocab, vocab);
        ++r;
        SampledToken drawn;
        drawn.token = -1;
        if (f.sampling && !(fallback_every_ > 0 && ++offered_rows_ % fallback_every_ == 0)) {
          drawn = sample_row(row, *f.sampling);
          std::fill(row.begin(), row.end(), std::numeric_limits<float>::quiet_NaN());
          ++sampled_rows_;
        } else if (f.sampling) {
          ++fallback_rows_;
        }
        out.sampled.push_back(std::move(drawn));
      }
    }
    return {};
  }
  std::optional<ExternalKv> external_kv() const override {
    return ExternalKv{own_->shape(), own_->block_layout()};
  }
  Result<std::unique_ptr<CopyDevice>> make_copy_device(std::span<std::byte> host,
                                                       CopyPath path) override {
    if (refuse_devices_) return make_error(ErrorCode::kResourceExhausted, "no pinned memory");
    host_ = host;
    path_ = path;
    auto device = std::make_unique<FakeCopyDevice>();
    device->set_auto(true);
    device_ = device.get();
    return std::unique_ptr<CopyDevice>(std::move(device));
  }

  std::unique_ptr<Model> inner_;
  int32_t num_pages_;
  std::unique_ptr<KvPool> own_;
  bool refuse_devices_ = false;
  bool sample_ = false;         // draw rows with sampling itself, as the GPU model does
  int64_t fallback_every_ = 0;  // leave every n-th such row to the engine (0: none)
  int64_t offered_rows_ = 0;    // rows with sampling seen while fallback_every_ > 0
  int64_t sampled_rows_ = 0;    // rows it drew
  int64_t fallback_rows_ = 0;   // rows with sampling it left to the engine
  std::span<std::byte> host_;   // the last device's host memory
  CopyPath path_ = CopyPath::kDirect;
  FakeCopyDevice* device_ = nullptr;  // the last one made (the engine owns it)
};

// The engine's counting pool was never written: every byte went to the model's own memory.
inline void expect_counting_pool_untouched(Engine& e) {
  const bool zero = engine_call(e, [](EngineState& s) {
                      const std::byte* p = s.kv_pool.block_layout().base;
                      return std::all_of(p, p + s.kv_pool.total_bytes(),
                                         [](std::byte b) { return b == std::byte{0}; });
                    }).get();
  EXPECT_TRUE(zero);
}

}  // namespace strata
