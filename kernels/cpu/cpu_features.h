// What the running CPU supports, asked once: the vector paths of kernels/cpu pick on these.
#pragma once

namespace lowbit {
namespace kernels {

#if defined(__x86_64__)
// AVX-512 F, BW, VL and DQ: every AVX-512 CPU since Skylake-SP has all four.
inline bool cpu_has_avx512() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return has;
}

// The above plus VBMI (byte permutes: Ice Lake, Zen 4 and later).
inline bool cpu_has_avx512_vbmi() {
  static const bool has = cpu_has_avx512() && __builtin_cpu_supports("avx512vbmi");
  return has;
}

// AVX2 and F16C (the AVX2 loops convert fp16 with it): Haswell, Zen 1 and later. FMA is not
// needed: the loops never fuse a multiply and an add.
inline bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return has;
}
#else
inline bool cpu_has_avx512() { return false; }
inline bool cpu_has_avx2() { return false; }
inline bool cpu_has_avx512_vbmi() { return false; }
#endif

}  // namespace kernels
}  // namespace lowbit
