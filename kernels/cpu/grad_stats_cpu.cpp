// Gradient checks before a step (grad_stats_cpu.h): one parallel loop over fixed chunks of every
// gradient; per chunk the largest |x| bit pattern (>= Inf's means Inf or NaN) and, on request, 16
// interleaved double partial sums of squares; chunks are combined in order afterwards.
#include "grad_stats_cpu.h"

#include <omp.h>

#include <algorithm>
#include <vector>

#include "../common/float_convert.h"
#include "optim_step_parts.h"

namespace lowbit {
namespace kernels {
namespace {

struct ChunkStats {
  uint32_t max_bits;
  double sumsq;
};

template <typename T>
__attribute__((target_clones("avx512f", "avx2", "default"))) uint32_t max_abs_bits(const T* __restrict__ x,
                                                                                  int64_t len) {
  uint32_t m = 0;
  for (int64_t i = 0; i < len; ++i) {
    const uint32_t a = f32_bits(to_f32(x[i])) & 0x7FFFFFFFu;
    m = a > m ? a : m;
  }
  return m;
}

// Lane j of the 16 accumulators takes elements j, j + 16, ...; the lanes are added in order.
template <typename T>
__attribute__((target_clones("avx512f", "avx2", "default"))) double sum_squares(const T* __restrict__ x,
                                                                               int64_t len) {
  double acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= len; i += 16)
    for (int j = 0; j < 16; ++j) {
      const double v = to_f32(x[i + j]);
      acc[j] += v * v;
    }
  for (int j = 0; i + j < len; ++j) {
    const double v = to_f32(x[i + j]);
    acc[j] += v * v;
  }
  double s = 0.0;
  for (int j = 0; j < 16; ++j) s += acc[j];
  return s;
}

template <typename T>
ChunkStats chunk_stats(const T* x, int64_t len, bool want_sumsq) {
  ChunkStats c{max_abs_bits(x, len), 0.0};
  if (want_sumsq && c.max_bits < 0x7F800000u) c.sumsq = sum_squares(x, len);
  return c;
}

}  // namespace

void grad_stats_cpu(const GradRef* grads, int64_t count, bool want_sumsq, uint8_t* finite, double* sumsq) {
  std::vector<int64_t> first(count + 1, 0);
  for (int64_t i = 0; i < count; ++i) first[i + 1] = first[i] + (grads[i].numel + kGradChunk - 1) / kGradChunk;
  std::vector<ChunkStats> stats(first[count]);
  // Handed out as threads come free, as the step's own chunks.
  constexpr int64_t per_thread_chunk = kThreadChunkElements / kGradChunk;
#pragma omp parallel for schedule(dynamic, per_thread_chunk)
  for (int64_t item = 0; item < first[count]; ++item) {
    const int64_t g = std::upper_bound(first.begin(), first.end(), item) - first.begin() - 1;
    const GradRef& r = grads[g];
    const int64_t begin = (item - first[g]) * kGradChunk;
    const int64_t len = std::min(kGradChunk, r.numel - begin);
    switch (r.type) {
      case ElemType::F32: stats[item] = chunk_stats(static_cast<const float*>(r.data) + begin, len, want_sumsq); break;
      case ElemType::BF16: stats[item] = chunk_stats(static_cast<const bf16_t*>(r.data) + begin, len, want_sumsq); break;
      case ElemType::F16: stats[item] = chunk_stats(static_cast<const f16_t*>(r.data) + begin, len, want_sumsq); break;
    }
  }
  for (int64_t g = 0; g < count; ++g) {
    uint32_t m = 0;
    double s = 0.0;
    for (int64_t item = first[g]; item < first[g + 1]; ++item) {
      m = std::max(m, stats[item].max_bits);
      s += stats[item].sumsq;
    }
    finite[g] = m < 0x7F800000u ? 1 : 0;
    if (want_sumsq) sumsq[g] = s;
  }
}

}  // namespace kernels
}  // namespace lowbit
