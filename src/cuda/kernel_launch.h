// The CUDA translation units' entry points (row_kernels.cu, decode_attention_d*.cu), called
// by kernels.cc once it has checked the arguments. Internal to the module: callers use
// kernels.h. Each queues its kernels on `stream` and returns the launch's cudaError_t (0:
// launched), which kernels.cc turns into a Status; nothing here includes a C++23 header.
#pragma once

#include <cstdint>

#include "cuda/kernel_args.h"

namespace strata::cuda::detail {

int launch_fused_add_rms_norm(uint16_t* x, float* residual, const uint16_t* weight, int32_t rows,
                              int32_t dim, float eps, StreamHandle stream);
int launch_rms_norm(const uint16_t* x, uint16_t* y, const uint16_t* weight, int32_t rows,
                    int32_t dim, float eps, StreamHandle stream);
int launch_silu_mul(const uint16_t* gate_up, uint16_t* out, int32_t rows, int32_t inter,
                    StreamHandle stream);
int launch_gather_rows(const uint16_t* src, const int32_t* index, uint16_t* dst, int32_t rows,
                       int32_t cols, StreamHandle stream);
int launch_add_bias(uint16_t* x, const float* bias, int32_t rows, int32_t cols,
                    StreamHandle stream);
int launch_sample_rows(const SampleRowsArgs& args, StreamHandle stream);
// One instantiation per head size, one per file (decode_attention_d64.cu, _d128.cu).
int launch_decode_attention_d64(const DecodeAttentionArgs& args, StreamHandle stream);
int launch_decode_attention_d128(const DecodeAttentionArgs& args, StreamHandle stream);

// One instantiation per head size, one per file (extend_attention_d64.cu, _d128.cu).
int launch_extend_attention_d64(const ExtendAttentionArgs& args, StreamHandle stream);
int launch_extend_attention_d128(const ExtendAttentionArgs& args, StreamHandle stream);
// The tensor-core kernel (extend_attention_tc.cuh), likewise.
int launch_extend_attention_tc_d64(const ExtendAttentionArgs& args, StreamHandle stream);
int launch_extend_attention_tc_d128(const ExtendAttentionArgs& args, StreamHandle stream);

int launch_qk_norm_rope_store(const QkNormRopeStoreArgs& args, StreamHandle stream);
// The copy kernel: spans[0 .. count) (page-locked host memory the device reads) copied by
// `blocks` thread blocks, each taking spans in turn.
int launch_copy_spans(const CopySpanArg* spans, int32_t count, int32_t blocks, StreamHandle stream);

}  // namespace strata::cuda::detail
