// What a pickle written by libtorch's pickler claims about each tensor's bytes, and edits of those
// claims, for the tests and the fuzzer: the storage's element count (the last field of its
// persistent id, before BINPERSID), and the tensor's storage offset, sizes and strides (the
// arguments of _rebuild_tensor_v2 that follow it). libtorch's unpickler takes all of them as they
// are; the loaders check them against the records.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace lowbit_test {

// An integer opcode in a pickle: where it is, how many bytes it takes, the value it pushes.
struct PickleInt {
  size_t at = 0, len = 0;
  int64_t value = 0;
};

// One tensor's claims. `sizes` and `strides` are empty where the opcodes after the persistent id
// are not the pickler's usual (offset, MARK ints TUPLE, MARK ints TUPLE).
struct TensorClaims {
  std::string key;  // the storage's record: data/<key>
  PickleInt numel, offset;
  std::vector<PickleInt> sizes, strides;
};

namespace pickle_detail {

struct Op {
  size_t at = 0, len = 0;  // the opcode's byte and its argument
  unsigned char code = 0;
};

inline uint64_t le(const std::string& s, size_t at, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= uint64_t(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return v;
}

// The opcodes of `p` in order; empty if one is not of protocol 2's binary set (or runs past the end).
inline std::vector<Op> ops(const std::string& p) {
  std::vector<Op> out;
  size_t i = 0;
  while (i < p.size()) {
    const unsigned char c = static_cast<unsigned char>(p[i]);
    size_t arg = 0;  // fixed-size argument, or a length prefix and what it counts
    auto counted = [&](size_t prefix) -> bool {
      if (i + 1 + prefix > p.size()) return false;
      arg = prefix + static_cast<size_t>(le(p, i + 1, prefix));
      return true;
    };
    bool ok = true;
    switch (c) {
      case 0x80: arg = 1; break;                         // PROTO
      case 0x95: arg = 8; break;                         // FRAME
      case 'K': case 'q': case 'h': arg = 1; break;      // BININT1, BINPUT, BINGET
      case 'M': arg = 2; break;                          // BININT2
      case 'J': case 'r': case 'j': arg = 4; break;      // BININT, LONG_BINPUT, LONG_BINGET
      case 'G': arg = 8; break;                          // BINFLOAT
      case 'X': case 'B': ok = counted(4); break;        // BINUNICODE, BINBYTES
      case 0x8c: case 'C': case 0x8a: ok = counted(1); break;  // SHORT_BINUNICODE, SHORT_BINBYTES, LONG1
      case 0x8d: case 0x8e: ok = counted(8); break;      // BINUNICODE8, BINBYTES8
      case 0x8b: ok = counted(4); break;                 // LONG4
      case 'c': {                                        // GLOBAL: two lines
        const size_t a = p.find('\n', i + 1), b = a == std::string::npos ? a : p.find('\n', a + 1);
        if (b == std::string::npos) return {};
        arg = b - i;
        break;
      }
      case '(': case '.': case '0': case '1': case '2': case 'N': case 0x88: case 0x89: case ')': case 't':
      case 0x85: case 0x86: case 0x87: case ']': case 'a': case 'e': case 'l': case '}': case 'd': case 's':
      case 'u': case 0x94: case 'Q': case 'R': case 'b': case 0x81: case 0x93:
        break;
      default: return {};
    }
    if (!ok || i + 1 + arg > p.size()) return {};
    out.push_back({i, 1 + arg, c});
    i += 1 + arg;
    if (c == '.') break;
  }
  return out;
}

inline bool is_int(const Op& o) { return o.code == 'K' || o.code == 'M' || o.code == 'J' || o.code == 0x8a; }
inline bool is_memo(const Op& o) { return o.code == 'q' || o.code == 'r' || o.code == 0x94; }

inline PickleInt int_of(const std::string& p, const Op& o) {
  PickleInt v{o.at, o.len, 0};
  switch (o.code) {
    case 'K': v.value = static_cast<int64_t>(le(p, o.at + 1, 1)); break;
    case 'M': v.value = static_cast<int64_t>(le(p, o.at + 1, 2)); break;
    case 'J': v.value = static_cast<int32_t>(le(p, o.at + 1, 4)); break;
    default: {  // LONG1: little-endian two's complement of its length (8 where libtorch wrote it)
      const size_t n = o.len - 2;
      const uint64_t raw = n >= 8 ? le(p, o.at + 2, 8) : le(p, o.at + 2, n);
      v.value = n >= 8 || n == 0 || !(raw >> (8 * n - 1)) ? static_cast<int64_t>(raw)
                                                         : static_cast<int64_t>(raw | (~uint64_t(0) << (8 * n)));
    }
  }
  return v;
}

}  // namespace pickle_detail

// Every tensor's claims in `pickle`, in order; empty if it is not a pickle the walk understands.
inline std::vector<TensorClaims> tensor_claims(const std::string& pickle) {
  using namespace pickle_detail;
  const std::vector<Op> o = ops(pickle);
  std::vector<TensorClaims> out;
  // The opcode before / after index i, skipping memo writes; o.size() when there is none.
  auto prev = [&](size_t i) {
    while (i > 0 && is_memo(o[i - 1])) --i;
    return i == 0 ? o.size() : i - 1;
  };
  auto next = [&](size_t i) {
    ++i;
    while (i < o.size() && is_memo(o[i])) ++i;
    return i;
  };
  for (size_t i = 0; i < o.size(); ++i) {
    if (o[i].code != 'Q') continue;
    const size_t tuple = prev(i), numel = tuple < o.size() ? prev(tuple) : o.size();
    if (tuple >= o.size() || o[tuple].code != 't' || numel >= o.size() || !is_int(o[numel])) continue;
    TensorClaims t;
    t.numel = int_of(pickle, o[numel]);
    const size_t device = prev(numel), key = device < o.size() ? prev(device) : o.size();
    if (key < o.size() && o[key].code == 'X') t.key = pickle.substr(o[key].at + 5, o[key].len - 5);
    size_t j = next(i);
    if (j < o.size() && is_int(o[j])) {
      t.offset = int_of(pickle, o[j]);
      std::vector<PickleInt>* lists[] = {&t.sizes, &t.strides};
      bool whole = true;
      for (std::vector<PickleInt>* list : lists) {
        j = next(j);
        if (j >= o.size() || o[j].code != '(') {
          whole = false;
          break;
        }
        for (j = next(j); j < o.size() && is_int(o[j]); j = next(j)) list->push_back(int_of(pickle, o[j]));
        if (j >= o.size() || o[j].code != 't') {
          whole = false;
          break;
        }
      }
      if (!whole || t.sizes.size() != t.strides.size()) t.sizes.clear(), t.strides.clear();
    }
    out.push_back(std::move(t));
  }
  return out;
}

// `pickle` with integer opcode `at` replaced by one pushing `v` (BININT1 / BININT2 / BININT, or
// an 8-byte LONG1, the only length libtorch's unpickler reads). Later positions move by the
// difference in length: edit from the end.
inline std::string set_pickle_int(const std::string& pickle, const PickleInt& at, int64_t v) {
  std::string op;
  if (v >= 0 && v < 256) {
    op = {'K', static_cast<char>(v)};
  } else if (v >= 0 && v < 65536) {
    op = {'M', static_cast<char>(v & 0xFF), static_cast<char>(v >> 8)};
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    const uint32_t u = static_cast<uint32_t>(static_cast<int32_t>(v));
    op = {'J'};
    for (int k = 0; k < 4; ++k) op += static_cast<char>((u >> (8 * k)) & 0xFF);
  } else {
    const uint64_t u = static_cast<uint64_t>(v);
    op = {static_cast<char>(0x8a), 8};
    for (int k = 0; k < 8; ++k) op += static_cast<char>((u >> (8 * k)) & 0xFF);
  }
  return pickle.substr(0, at.at) + op + pickle.substr(at.at + at.len);
}

}  // namespace lowbit_test
