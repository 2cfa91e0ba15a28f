// Blockwise quantize on the GPU (CUDA; HIP compiles the same file through portability.cuh).
//
// Work split: each warp takes a "unit" of the input. When a quantization block fits in one warp's
// 8 elements per lane (BLOCK <= 8*WARP), a unit is 8*WARP elements holding several blocks, each
// owned by a group of BLOCK/8 lanes that reduce its absmax with shuffles. Larger blocks are one unit
// each: the warp scans the block chunk by chunk, reduces, then re-reads (from cache) to encode.
// Either way one group owns a block, so codes and absmax match the CPU loop bit for bit.
#include <algorithm>

#include "../common/compand.h"
#include "../common/encode.h"
#include "gpu_tables.cuh"
#include "quantize_cuda.h"
#include "vector_io.cuh"

namespace lowbit {
namespace kernels {
namespace {

constexpr int kThreads = 256;

template <int WIDTH>
__device__ __forceinline__ void group_reduce(BlockScan& s) {
  int flags = (s.nonfinite ? 1 : 0) | (s.negative ? 2 : 0);
#pragma unroll
  for (int off = WIDTH / 2; off > 0; off /= 2) {
    const float other = LOWBIT_SHFL_XOR(s.amax, off, WIDTH);
    s.amax = other > s.amax ? other : s.amax;
    flags |= LOWBIT_SHFL_XOR(flags, off, WIDTH);
  }
  s.nonfinite = flags & 1;
  s.negative = flags & 2;
}

// Encode tables in shared memory (see gpu_tables.cuh).
struct SharedEncode {
  uint8_t starts[1 << kWindowBucketBits];
  float thresholds[257];
  uint8_t sorted_codes[256];
};

template <bool IDENTITY>
__device__ __forceinline__ void stage_encode(SharedEncode& sh, const uint8_t* starts, const GpuTables& t) {
  const uint4* src = reinterpret_cast<const uint4*>(starts);
  uint4* dst = reinterpret_cast<uint4*>(sh.starts);
  stage(dst, src, (1 << kWindowBucketBits) / 16);
  stage(sh.thresholds, t.thresholds, 257);
  if (!IDENTITY) stage(sh.sorted_codes, t.sorted_codes, 256);
}

// #{thresholds < x}: the window bucket's start, then one compare (encode.h: window_bucket);
// formats whose codes are in value order (IDENTITY: the dynamic maps and the 4-bit ones) need no
// final code lookup. Both are compile-time, so each format's kernel issues only the instructions
// it needs (the kernel is bound by instructions). TABLE false: a companded format, encoded by
// arithmetic (compand.h), no table.
template <bool TABLE, bool IDENTITY>
__device__ __forceinline__ uint8_t encode_one(const SharedEncode& sh, float x, bool is_signed) {
  if constexpr (!TABLE) return pow8_encode(x, is_signed);
  const int s = sh.starts[window_bucket(__float_as_uint(x))];
  const int c = s + (sh.thresholds[s] < x ? 1 : 0);
  return IDENTITY ? static_cast<uint8_t>(c) : sh.sorted_codes[c];
}

// Encodes 8 values and stores their codes at element offset i (8-bit: 8 bytes; 4-bit: 4 bytes).
template <int BITS, bool TABLE, bool IDENTITY>
__device__ __forceinline__ void encode_store8(const float (&v)[8], const Normalizer& nz, const SharedEncode& sh,
                                              bool is_signed, uint8_t* codes, int64_t i, int64_t n, bool vec) {
  uint8_t c[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) c[k] = encode_one<TABLE, IDENTITY>(sh, normalize(nz, v[k]), is_signed);
  store_codes8<BITS>(codes, i, n, vec, c);
}

// One lane's 8 values of a block owned by GROUP lanes: reduce the absmax across the group, store it
// (first lane), encode and store the codes.
template <int BITS, bool TABLE, bool IDENTITY, int BLOCK, int GROUP>
__device__ __forceinline__ void quantize_group8(const float (&v)[8], int64_t i, int lane, int64_t n, bool is_signed,
                                                bool vec, const SharedEncode& sh, uint8_t* codes, float* absmax) {
  BlockScan s;
#pragma unroll
  for (int k = 0; k < 8; ++k) scan_add(s, v[k]);
  group_reduce<GROUP>(s);
  const float amax = block_absmax(s, is_signed);
  if (lane % GROUP == 0 && i < n) absmax[i / BLOCK] = amax;
  if (i < n) encode_store8<BITS, TABLE, IDENTITY>(v, make_normalizer(amax), sh, is_signed, codes, i, n, vec);
}

template <typename T, int BITS, bool TABLE, bool IDENTITY, int BLOCK, int WARP>
__global__ void __launch_bounds__(kThreads) quantize_kernel(const T* __restrict__ x, uint8_t* __restrict__ codes,
                                                            float* __restrict__ absmax, int64_t n, bool is_signed,
                                                            bool vec, const uint8_t* __restrict__ starts,
                                                            GpuTables tables) {
  __shared__ __align__(16) SharedEncode sh;  // unused (and dropped) without a table
  if (TABLE) {
    stage_encode<IDENTITY>(sh, starts, tables);
    __syncthreads();
  }

  constexpr int kUnit = BLOCK <= kElemsPerThread * WARP ? kElemsPerThread * WARP : BLOCK;
  constexpr int kGroup = BLOCK <= kElemsPerThread * WARP ? BLOCK / kElemsPerThread : WARP;
  constexpr int kChunks = kUnit / (kElemsPerThread * WARP);  // passes per unit (1 for small blocks)
  const int lane = threadIdx.x % WARP;
  const int64_t warps_total = int64_t(gridDim.x) * (kThreads / WARP);
  const int64_t units = (n + kUnit - 1) / kUnit;
  const int64_t first = int64_t(blockIdx.x) * (kThreads / WARP) + threadIdx.x / WARP;
  if constexpr (kChunks == 1 && BITS == 4) {
    // Software-pipelined: the next unit's loads are issued before this unit's reduce and encode,
    // so each thread keeps a load in flight through its compute. Measured on an H100: 4-bit
    // 67% -> 71% of copy bandwidth, but 8-bit 79-85% -> 73-75% (more registers), so 8-bit skips it.
    float v[8];
    if (first < units) load8(x, first * kUnit + int64_t(lane) * kElemsPerThread, n, vec, v);
    for (int64_t unit = first; unit < units; unit += warps_total) {
      const int64_t i = unit * kUnit + int64_t(lane) * kElemsPerThread;
      float next[8];
      if (unit + warps_total < units) load8(x, i + warps_total * kUnit, n, vec, next);
      quantize_group8<BITS, TABLE, IDENTITY, BLOCK, kGroup>(v, i, lane, n, is_signed, vec, sh, codes, absmax);
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = next[k];
    }
  } else if constexpr (kChunks == 1) {
    for (int64_t unit = first; unit < units; unit += warps_total) {
      const int64_t i = unit * kUnit + int64_t(lane) * kElemsPerThread;
      float v[8];
      load8(x, i, n, vec, v);
      quantize_group8<BITS, TABLE, IDENTITY, BLOCK, kGroup>(v, i, lane, n, is_signed, vec, sh, codes, absmax);
    }
  } else {
    for (int64_t unit = first; unit < units; unit += warps_total) {
      const int64_t base = unit * kUnit;
      BlockScan s;
      for (int c = 0; c < kChunks; ++c) {
        float v[8];
        load8(x, base + (int64_t(c) * WARP + lane) * kElemsPerThread, n, vec, v);
#pragma unroll
        for (int k = 0; k < 8; ++k) scan_add(s, v[k]);
      }
      group_reduce<WARP>(s);
      const float amax = block_absmax(s, is_signed);
      const Normalizer nz = make_normalizer(amax);
      if (lane == 0) absmax[unit] = amax;
      for (int c = 0; c < kChunks; ++c) {
        const int64_t i = base + (int64_t(c) * WARP + lane) * kElemsPerThread;
        if (i >= n) break;
        float v[8];
        load8(x, i, n, vec, v);
        encode_store8<BITS, TABLE, IDENTITY>(v, nz, sh, is_signed, codes, i, n, vec);
      }
    }
  }
}

template <typename T, int BITS, bool TABLE, bool IDENTITY, int BLOCK, int WARP>
cudaError_t launch(const QuantizeParams& p, const DeviceInfo& dev, cudaStream_t stream) {
  constexpr int kUnit = BLOCK <= kElemsPerThread * WARP ? kElemsPerThread * WARP : BLOCK;
  const int64_t units = (p.n + kUnit - 1) / kUnit;
  const int64_t warps_per_block = kThreads / WARP;
  const int64_t wanted = (units + warps_per_block - 1) / warps_per_block;
  const int grid = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wanted, int64_t(dev.sm_count) * 8)));
  const bool vec = reinterpret_cast<uintptr_t>(p.input) % 16 == 0 && reinterpret_cast<uintptr_t>(p.codes) % 8 == 0;
  const uint8_t* starts = nullptr;
  const cudaError_t e = device_window_starts(p.format, &starts);
  if (e != cudaSuccess) return e;
  quantize_kernel<T, BITS, TABLE, IDENTITY, BLOCK, WARP><<<grid, kThreads, 0, stream>>>(
      static_cast<const T*>(p.input), p.codes, p.absmax, p.n, format_is_signed(p.format), vec, starts,
      gpu_tables(p.format));
  return cudaGetLastError();
}

// Turns the runtime block size into a template argument (32 .. 4096).
template <typename T, int BITS, bool TABLE, bool IDENTITY, int WARP>
cudaError_t dispatch_block(const QuantizeParams& p, const DeviceInfo& dev, cudaStream_t s) {
  switch (p.block_size) {
    case 32: return launch<T, BITS, TABLE, IDENTITY, 32, WARP>(p, dev, s);
    case 64: return launch<T, BITS, TABLE, IDENTITY, 64, WARP>(p, dev, s);
    case 128: return launch<T, BITS, TABLE, IDENTITY, 128, WARP>(p, dev, s);
    case 256: return launch<T, BITS, TABLE, IDENTITY, 256, WARP>(p, dev, s);
    case 512: return launch<T, BITS, TABLE, IDENTITY, 512, WARP>(p, dev, s);
    case 1024: return launch<T, BITS, TABLE, IDENTITY, 1024, WARP>(p, dev, s);
    case 2048: return launch<T, BITS, TABLE, IDENTITY, 2048, WARP>(p, dev, s);
    case 4096: return launch<T, BITS, TABLE, IDENTITY, 4096, WARP>(p, dev, s);
  }
  return cudaErrorInvalidValue;
}

// The format's encode shape as template arguments: the four the built-in formats have.
template <typename T, int WARP>
cudaError_t dispatch_format(const QuantizeParams& p, const DeviceInfo& dev, cudaStream_t s) {
  const GpuTables& t = gpu_tables(p.format);
  const int bits = format_bits(p.format);
  if (is_arithmetic_format(p.format)) return dispatch_block<T, 8, false, true, WARP>(p, dev, s);  // Pow8*
  if (bits == 4 && t.identity) return dispatch_block<T, 4, true, true, WARP>(p, dev, s);
  if (bits == 8 && !t.identity) return dispatch_block<T, 8, true, false, WARP>(p, dev, s);  // fp8
  if (bits == 8 && t.identity) return dispatch_block<T, 8, true, true, WARP>(p, dev, s);    // Dyn8*
  return cudaErrorNotSupported;
}

template <int WARP>
cudaError_t dispatch_type(const QuantizeParams& p, const DeviceInfo& dev, cudaStream_t s) {
  switch (p.input_type) {
    case ElemType::F32: return dispatch_format<float, WARP>(p, dev, s);
    case ElemType::BF16: return dispatch_format<bf16_t, WARP>(p, dev, s);
    case ElemType::F16: return dispatch_format<f16_t, WARP>(p, dev, s);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

const char* quantize_blockwise_gpu(const QuantizeParams& p, void* stream) {
  if (p.n == 0) return nullptr;
  if (!is_valid_block_size(p.block_size)) return "block_size must be a power of two in [32, 4096]";
  DeviceInfo dev;
  cudaError_t e = query_device(&dev);
  if (e != cudaSuccess) return cudaGetErrorString(e);
  const auto s = static_cast<cudaStream_t>(stream);
  bool launched = false;
#define LOWBIT_WARP_CASE(W)                 \
  if (!launched && dev.warp_size == W) {    \
    e = dispatch_type<W>(p, dev, s);        \
    launched = true;                        \
  }
  LOWBIT_FOR_EACH_WARP_SIZE(LOWBIT_WARP_CASE)
#undef LOWBIT_WARP_CASE
  if (!launched) return "unsupported warp size";
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace kernels
}  // namespace lowbit
