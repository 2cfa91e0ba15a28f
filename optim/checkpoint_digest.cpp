// digest_bytes (checkpoint_digest.h).
#include "checkpoint_digest.h"

#include <cstring>

namespace lowbit {
namespace optim {

namespace {
constexpr uint64_t kPrime = 0x100000001b3ull;  // FNV-1a's 64-bit prime (odd: multiplication is a bijection)

inline uint64_t mix(uint64_t h, uint64_t w) { return (h ^ w) * kPrime; }
}  // namespace

uint64_t digest_bytes(const void* data, size_t n, uint64_t seed) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint64_t h = seed;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);  // unaligned-safe; checkpoints are written and read little-endian
    h = mix(h, w);
  }
  for (; i < n; ++i) h = mix(h, p[i]);
  h = mix(h, static_cast<uint64_t>(n));
  // Avalanche (the finalizer of MurmurHash3's fmix64) so that nearby inputs spread over all bits.
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

}  // namespace optim
}  // namespace lowbit
