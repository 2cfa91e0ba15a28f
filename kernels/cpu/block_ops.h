// Per-block loops shared by the CPU quantizer and the fused optimizer step, compiled for
// AVX-512, AVX2 and baseline x86-64 (picked at load time; identical results on each).
#pragma once

#include <cstdint>

#include "../common/encode.h"
#include "../common/float_convert.h"
#include "../common/format_table.h"
#include "format_tables.h"

namespace lowbit {
namespace kernels {

// Copies a block to fp32 in v; returns the largest |x| bit pattern and whether a negative value
// occurs (see block_scan).
void scan_block(const float* x, int64_t len, float* v, uint32_t* max_bits, uint32_t* negative);
void scan_block(const bf16_t* x, int64_t len, float* v, uint32_t* max_bits, uint32_t* negative);
void scan_block(const f16_t* x, int64_t len, float* v, uint32_t* max_bits, uint32_t* negative);
// The same scan of fp32 values without the copy.
void scan_block(const float* x, int64_t len, uint32_t* max_bits, uint32_t* negative);

// Finishes quantizing a block already scanned, its values in fp32 at v: absmax from
// the scan, normalize, encode, and write the codes at `out` (the block's first code byte; 4-bit
// codes packed two per byte). Returns the absmax to store.
float encode_scanned_block(const FormatView& fmt, bool format_signed, const float* v, int64_t len, uint32_t max_bits,
                           uint32_t negative, uint8_t* out);

// How many blocks ahead the CPU loops prefetch their input (a build-time tunable; on the H100
// host 8 beat 4 and 16 for the step: Q8 AdamW 1.39-1.48x memcpy against 1.57-1.77 and 1.66-1.70).
#ifndef LOWBIT_PREFETCH_BLOCKS
#define LOWBIT_PREFETCH_BLOCKS 8
#endif
constexpr int64_t kPrefetchBlocks = LOWBIT_PREFETCH_BLOCKS;

// Software prefetch of a byte range into every cache level (one hint per cache line): each core
// streams several arrays, and the hardware prefetchers fall behind when all cores do. (Non-temporal
// hints measured slower on the H100 host: quantize 48-55 GB/s against 64-85.)
inline void prefetch_range(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(c + o, 0, 3);
}

}  // namespace kernels
}  // namespace lowbit
