// A 64-bit digest of bytes for checkpoint integrity (format version 2): torch-free, deterministic.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lowbit {
namespace optim {

constexpr uint64_t kDigestSeed = 0xcbf29ce484222325ull;  // FNV-1a's offset basis

// FNV-1a style over 8-byte little-endian words (then the tail bytes, then the length), finished
// by a 64-bit avalanche. Each step h = (h ^ w) * P is a bijection of h for a fixed word w and of
// w for a fixed h, so any change confined to one 8-byte word (every single bit flip) always
// changes the digest. `seed` chains digests: digest(b, n, digest(a, m)).
uint64_t digest_bytes(const void* data, size_t n, uint64_t seed = kDigestSeed);

}  // namespace optim
}  // namespace lowbit
