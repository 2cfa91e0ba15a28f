// LAMB's first pass on GPUs: per norm block, the sums of p^2 and r^2 (r the update direction before
// the trust ratio) in double, in the CPU kernel's order (kernels/cpu: lamb_norms_cpu), into the
// launch's scratch; optim_step_cuda.cu adds the blocks' sums per parameter.
#pragma once

#include <type_traits>

#include "speculative_arith.cuh"
#include "step_element_access.cuh"
#include "step_tuning.cuh"

namespace lowbit {
namespace kernels {
namespace gpu_step {

// LAMB's first pass: one warp per norm block, each warp a contiguous run of blocks (so the
// parameter index only moves forward). Lanes load 8 consecutive elements each, as the step does,
// and square p and the direction r in double. kernels/cpu's order: element i joins partial sum
// i mod 16 in increasing i, then the 16 partials are added in order. Of a chunk of 8 * WARP
// elements, partial c takes elements c, c + 16, ...: element e of lane L is value L / 2 of partial
// 8 (L % 2) + e. The warp writes each partial's values of the chunk as one row of shared memory,
// in order; then lane c < 16 adds row c of the squares of p to its partial, lane 16 + c row c of
// the squares of r, two doubles per load. Elements past the block's end are 0 and add +0.0, which
// changes no sum. (Rows in element order, 16 lanes adding both sums one double at a time, took
// twice the instructions.)
// Row c starts at c * kRowStride, rows 8..15 8 doubles further: the stores of one element by the
// warp's even lanes (row e) and odd lanes (row 8 + e) then fall in different banks, and each row
// starts on 16 bytes for the two-double loads.
template <int WARP>
struct LambRows {
  static constexpr int kPerPartial = 8 * WARP / 16;      // values of each partial in a chunk
  static constexpr int kRowStride = kPerPartial + 2;     // doubles, even
  static constexpr int kDoubles = 16 * kRowStride + 8;   // one sum's rows
  static __device__ __forceinline__ int start(int c) { return c * kRowStride + (c >= 8 ? 8 : 0); }
};

// The same rows holding p and r themselves, as floats, for blocks of a chunk or more: a float's
// square is exact in double (48 significant bits; exponents within double's range), so the lane
// that adds a row squares each value there, with the same product and the same additions in the
// same order, and the rows move half the bytes through shared memory (with rows of
// squares, the L1 / shared-memory pipeline was the limit). Row c starts at c * kRowStride floats,
// rows 8..15 16 floats further (32 banks: the even and odd lanes' stores of one element then fall
// in different banks), each on 16 bytes for four-float loads.
template <int WARP>
struct LambFloatRows {
  static constexpr int kPerPartial = 8 * WARP / 16;
  static constexpr int kRowStride = kPerPartial + 4;     // floats, a multiple of 4
  static constexpr int kFloats = 16 * kRowStride + 16;   // one sum's rows
  static __device__ __forceinline__ int start(int c) { return c * kRowStride + (c >= 8 ? 16 : 0); }
};

// The 8 elements at i of LAMB's first pass: parameter (master value), gradient, decoded state;
// 0 past `end`. FULL: the 8 are in range and aligned.
template <bool FULL, typename T, int FAMILY>
__device__ __forceinline__ void lamb_load(const StepParamRef& P, const Args& a, const float (*codebooks)[256], int64_t i,
                                          int64_t end, bool vec, float (&p)[8], float (&g)[8], float (&s)[2][8]) {
  if constexpr (FULL) {
    // Every load issued first, as the step kernel's units do (UnitBytes).
    UnitBytes<T, FAMILY, 2> u;
    u.load(P, a, i);
    u.param_grad(a, P.grad_type, p, g);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      if (FAMILY == kF32) {
        convert8<float>(u.slot[k], s[k]);
      } else if (FAMILY == kBF16) {
        convert8<bf16_t>(u.slot[k], s[k]);
      } else {
        uint8_t c[8];
        u.codes(k, c);
        const float* cb = codebooks[a.format_of_slot[k]];
#pragma unroll
        for (int e = 0; e < 8; ++e) s[k][e] = decode_value(cb, c[e], u.amax[k]);
      }
    }
    return;
  }
  load8(static_cast<const T*>(P.param), i, end, vec, p);
  if constexpr (std::is_same<T, bf16_t>::value) {
    if (a.correction_bits != 0) add_corrections<false>(P, a.correction_bits, i, end, vec, p);
  }
  load_grad8(P.grad, P.grad_type, i, end, vec, g);
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    if (FAMILY == kF32) {
      load8(static_cast<const float*>(P.slot[k]), i, end, vec, s[k]);
    } else if (FAMILY == kBF16) {
      load8(static_cast<const bf16_t*>(P.slot[k]), i, end, vec, s[k]);
    } else {
      uint8_t c[8];
      load_codes8<FAMILY == kCodes8 ? 8 : 4>(static_cast<const uint8_t*>(P.slot[k]), i, end, vec, c);
      // The lane's own block (a chunk can hold several small ones); none past the end.
      const float amax = i < end ? P.absmax[k][i >> a.block_shift] : 0.0f;
      const float* cb = codebooks[a.format_of_slot[k]];
#pragma unroll
      for (int e = 0; e < 8; ++e) s[k][e] = i + e < end ? decode_value(cb, c[e], amax) : 0.0f;  // code 0 is not 0
    }
  }
}

template <typename T, int FAMILY, int WARP>
__global__ void __launch_bounds__(kThreads, Tuning::lamb_min_blocks(FAMILY)) lamb_sums_kernel(const LOWBIT_GRID_CONSTANT Chunk chunk,
                                                             const LOWBIT_GRID_CONSTANT Args a) {
  constexpr bool kQuant = is_quant_family(FAMILY);
  constexpr int kWarps = kThreads / WARP, kChunkElems = 8 * WARP;
  using Rows = LambRows<WARP>;
  using FloatRows = LambFloatRows<WARP>;
  // Decoding needs only the codebooks (2 KiB, not the encode tables): room for the squares.
  __shared__ __align__(16) float codebooks[2][256];
  __shared__ __align__(16) double rows[kWarps][2][Rows::kDoubles];
  static_assert(sizeof(float) * 2 * FloatRows::kFloats <= sizeof(double) * 2 * Rows::kDoubles, "float rows fit");
  float (*const float_rows)[2][FloatRows::kFloats] = reinterpret_cast<float (*)[2][FloatRows::kFloats]>(rows);
  if (kQuant) {
    for (int d = 0; d < a.num_distinct; ++d) stage(codebooks[d], a.distinct[d]->codebook, 256);
    __syncthreads();
  }
  if (a.found_inf && *a.found_inf != 0.0f) return;
  const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
  const int64_t warps = int64_t(gridDim.x) * kWarps, warp = int64_t(blockIdx.x) * kWarps + w;
  const int64_t blocks = chunk.first_block[chunk.count];
  const int64_t b0 = blocks * warp / warps, b1 = blocks * (warp + 1) / warps;
  const int64_t B = a.block_size;
  int j = 0;
  // The squares of a chunk's 8 elements per lane, into the rows (see LambRows). Elements from
  // `valid` on are past the end: p, g and the state are 0 there, but the direction is 0 / eps,
  // NaN with eps 0, so r is set to 0.
  // The directions of 8 elements, with division and square root by `ar` (speculative_arith.cuh).
  const auto directions = [&](const Hyper& h, float grad_mult, const float (&p)[8], const float (&g)[8],
                              const float (&s)[2][8], int64_t valid, auto&& ar, float (&r)[8]) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float st[2] = {s[0][e], s[1][e]};
      float mn, vn;
      r[e] = e < valid ? lamb_direction(h, g[e] * grad_mult, p[e], st, &mn, &vn, ar) : 0.0f;
    }
  };
  // FLOATS: p and r into LambFloatRows; else their squares into LambRows.
  const auto square_into_rows = [&](const Hyper& h, float grad_mult, const float (&p)[8], const float (&g)[8],
                                    const float (&s)[2][8], int64_t valid, auto floats) {
    float r[8];
    SpeculativeArith ar;
    if (kLambSumsSpeculate) directions(h, grad_mult, p, g, s, valid, ar, r);
    if (!kLambSumsSpeculate || !ar.ok) directions(h, grad_mult, p, g, s, valid, ExactArith{}, r);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if constexpr (decltype(floats)::value) {
        const int at = FloatRows::start(8 * (lane % 2) + e) + lane / 2;
        float_rows[w][0][at] = p[e];
        float_rows[w][1][at] = r[e];
      } else {
        const int at = Rows::start(8 * (lane % 2) + e) + lane / 2;
        rows[w][0][at] = static_cast<double>(p[e]) * p[e];
        rows[w][1][at] = static_cast<double>(r[e]) * r[e];
      }
    }
  };
  using Squares = std::false_type;
  using Floats = std::integral_constant<bool, Tuning::lamb_float_rows>;
  if (B % 16 == 0 && B < kChunkElems) {
    // Blocks smaller than a chunk (Q4's 128, C8's 64): one chunk holds nb consecutive blocks of a
    // parameter, block t as values [t * B / 16, (t + 1) * B / 16) of every row. Lane c < 16 (p) and
    // 16 + c (r) add each block's segment of row c in order, and leave the partial in the
    // segment's first place (only that lane reads its row); then lane t < nb adds block t's 16 p
    // partials in order, lane nb + t its r partials. (One block per warp, as for larger blocks, left
    // most lanes without elements, and added the partials once per block by shuffles.)
    // SEG (B / 16, a power of two: block sizes are) as a constant unrolls the adds of the rows;
    // 0 takes it at run time.
    const auto small_blocks = [&](auto seg_constant) {
      constexpr int SEG = decltype(seg_constant)::value;
      const int seg = SEG != 0 ? SEG : static_cast<int>(B / 16);
      constexpr int kMostBlocks = Rows::kPerPartial / (SEG != 0 ? SEG : 1);  // per chunk
      for (int64_t item = b0; item < b1;) {
        while (j + 1 < chunk.count && chunk.first_block[j + 1] <= item) ++j;
        const StepParamRef& P = chunk.p[j];
        const ParamScalars& ps = a.scalars[chunk.first_param + j];
        const int64_t b = item - chunk.first_block[j], begin = b * B;
        const int64_t param_last = chunk.first_block[j + 1] < b1 ? chunk.first_block[j + 1] : b1;
        const int nb = static_cast<int>(kChunkElems / B < param_last - item ? kChunkElems / B : param_last - item);
        const int64_t end = P.numel - begin < nb * B ? P.numel : begin + nb * B;
        const bool vec = P.aligned != 0;
        const int64_t i = begin + int64_t(lane) * 8;
        float p[8], g[8], s[2][8];
        if (vec && begin + kChunkElems <= end) {
          lamb_load<true, T, FAMILY>(P, a, codebooks, i, end, vec, p, g, s);
          square_into_rows(ps.hyper, ps.grad_mult, p, g, s, 8, Squares{});
        } else {
          lamb_load<false, T, FAMILY>(P, a, codebooks, i, end, vec, p, g, s);
          square_into_rows(ps.hyper, ps.grad_mult, p, g, s, end - i, Squares{});
        }
        LOWBIT_SYNCWARP();
        if (lane < 32) {
          double* row = &rows[w][lane / 16][Rows::start(lane % 16)];
#pragma unroll
          for (int t = 0; t < kMostBlocks; ++t) {
            if (t < nb) {
              double part = 0.0;
#pragma unroll
              for (int k = 0; k < (SEG != 0 ? SEG : seg); ++k) part += row[t * seg + k];
              row[t * seg] = part;
            }
          }
        }
        LOWBIT_SYNCWARP();
        if (lane < 2 * nb) {
          const int which = lane < nb ? 0 : 1, t = lane - which * nb;
          double sum = 0.0;
#pragma unroll
          for (int c = 0; c < 16; ++c) sum += rows[w][which][Rows::start(c) + t * seg];
          a.block_sums[2 * (item + t) + which] = sum;
        }
        LOWBIT_SYNCWARP();
        item += nb;
      }
    };
    switch (Tuning::lamb_seg_unroll ? B / 16 : 0) {
      case 4: small_blocks(std::integral_constant<int, 4>{}); break;
      case 8: small_blocks(std::integral_constant<int, 8>{}); break;
      default: small_blocks(std::integral_constant<int, 0>{}); break;
    }
    return;
  }
  for (int64_t item = b0; item < b1; ++item) {
    while (j + 1 < chunk.count && chunk.first_block[j + 1] <= item) ++j;
    const StepParamRef& P = chunk.p[j];
    const ParamScalars& ps = a.scalars[chunk.first_param + j];
    const Hyper h = ps.hyper;
    const float grad_mult = ps.grad_mult;  // maximize folded in by the prologue
    const int64_t b = item - chunk.first_block[j], begin = b * B;
    const int64_t end = P.numel - begin < B ? P.numel : begin + B;
    const bool vec = P.aligned != 0;
    double part = 0.0;  // lane c < 16: partial sum c of p's squares; lane 16 + c: of r's
    for (int64_t off = begin; off < end; off += kChunkElems) {
      const int64_t i = off + int64_t(lane) * 8;
      float p[8], g[8], s[2][8];
      // A whole chunk in range and aligned (every chunk of a large block but a parameter's
      // last): no bound tests.
      if (vec && off + kChunkElems <= end) {
        lamb_load<true, T, FAMILY>(P, a, codebooks, i, end, vec, p, g, s);
        square_into_rows(h, grad_mult, p, g, s, 8, Floats{});
      } else {
        lamb_load<false, T, FAMILY>(P, a, codebooks, i, end, vec, p, g, s);
        square_into_rows(h, grad_mult, p, g, s, end - i, Floats{});
      }
      LOWBIT_SYNCWARP();
      if (lane < 32) {
        if constexpr (Floats::value) {
          const float4* row = reinterpret_cast<const float4*>(&float_rows[w][lane / 16][FloatRows::start(lane % 16)]);
#pragma unroll
          for (int k = 0; k < FloatRows::kPerPartial / 4; ++k) {
            const float4 v = row[k];
            part += static_cast<double>(v.x) * v.x;
            part += static_cast<double>(v.y) * v.y;
            part += static_cast<double>(v.z) * v.z;
            part += static_cast<double>(v.w) * v.w;
          }
        } else {
          const double2* row = reinterpret_cast<const double2*>(&rows[w][lane / 16][Rows::start(lane % 16)]);
#pragma unroll
          for (int k = 0; k < Rows::kPerPartial / 2; ++k) {
            const double2 v = row[k];
            part += v.x;
            part += v.y;
          }
        }
      }
      LOWBIT_SYNCWARP();
    }
    // The 16 partials in order (every lane takes part in the shuffles).
    double sp = 0.0, sr = 0.0;
    for (int q = 0; q < 16; ++q) {
      sp += LOWBIT_SHFL(part, q, WARP);
      sr += LOWBIT_SHFL(part, 16 + q, WARP);
    }
    if (lane == 0) {
      a.block_sums[2 * item] = sp;
      a.block_sums[2 * item + 1] = sr;
    }
  }
}

}  // namespace gpu_step
}  // namespace kernels
}  // namespace lowbit
