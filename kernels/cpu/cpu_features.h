// What the running CPU supports, asked once: the vector paths of kernels/cpu pick on these.
#pragma once

#include <cstdlib>
#include <cstring>

namespace lowbit {
namespace kernels {

#if defined(__x86_64__)
// LOWBIT_CPU_CAP=avx2 in the environment keeps the loops below AVX-512 (the AVX2 loops run where
// the CPU has AVX-512 too: the tests check them on any x86 machine that way), =scalar below AVX2.
// Results are the same bits on every path; only the speed changes.
inline int cpu_cap() {  // 2: no cap, 1: AVX2 at most, 0: scalar
  static const int cap = [] {
    const char* c = std::getenv("LOWBIT_CPU_CAP");
    if (!c) return 2;
    return std::strcmp(c, "avx2") == 0 ? 1 : std::strcmp(c, "scalar") == 0 ? 0 : 2;
  }();
  return cap;
}

// AVX-512 F, BW, VL and DQ: every AVX-512 CPU since Skylake-SP has all four.
inline bool cpu_has_avx512() {
  static const bool has = cpu_cap() >= 2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
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
  static const bool has = cpu_cap() >= 1 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return has;
}
#else
inline bool cpu_has_avx512() { return false; }
inline bool cpu_has_avx2() { return false; }
inline bool cpu_has_avx512_vbmi() { return false; }
#endif

}  // namespace kernels
}  // namespace lowbit
