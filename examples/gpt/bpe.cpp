// BPE training and encoding. Training counts pairs over the distinct pieces of the text (weighted
// by how often each occurs) and updates the counts only where a merge changed a piece.
#include "bpe.h"

#include <algorithm>
#include <map>
#include <stdexcept>

namespace gpt {

namespace {

enum Class { kLetter, kDigit, kSpace, kOther };

Class class_of(unsigned char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80) return kLetter;
  if (c >= '0' && c <= '9') return kDigit;
  if (c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f' || c == '\v') return kSpace;
  return kOther;
}

uint64_t key(int32_t a, int32_t b) { return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b); }

}  // namespace

std::vector<std::string> split_pieces(const std::string& text) {
  std::vector<std::string> out;
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const size_t start = i;
    const unsigned char c = text[i];
    if (c == ' ' && i + 1 < n && class_of(text[i + 1]) != kSpace) ++i;  // the space joins the next word
    const Class k = class_of(text[i]);
    ++i;
    while (i < n && class_of(text[i]) == k) {
      // A run of whitespace leaves its last space to the word after it.
      if (k == kSpace && text[i] == ' ' && i + 1 < n && class_of(text[i + 1]) != kSpace) break;
      ++i;
    }
    out.emplace_back(text, start, i - start);
  }
  return out;
}

Bpe Bpe::train(const std::string& text, int64_t vocab) {
  if (vocab < 256) throw std::invalid_argument("BPE vocabulary " + std::to_string(vocab) + " < 256");
  Bpe bpe;
  const int64_t merges = vocab - 256;
  if (merges > 0) {
    // Distinct pieces with their counts, in a fixed (sorted) order.
    std::map<std::string, int64_t> counts;
    for (std::string& p : split_pieces(text)) ++counts[std::move(p)];
    std::vector<std::vector<int32_t>> words;
    std::vector<int64_t> freq;
    words.reserve(counts.size());
    for (const auto& kv : counts) {
      words.emplace_back(kv.first.begin(), kv.first.end());
      for (int32_t& t : words.back()) t &= 0xff;
      freq.push_back(kv.second);
    }
    std::unordered_map<uint64_t, int64_t> pairs;
    auto add_pairs = [&](const std::vector<int32_t>& w, int64_t f) {
      for (size_t j = 0; j + 1 < w.size(); ++j) pairs[key(w[j], w[j + 1])] += f;
    };
    for (size_t w = 0; w < words.size(); ++w) add_pairs(words[w], freq[w]);
    for (int64_t m = 0; m < merges; ++m) {
      uint64_t best = 0;
      int64_t best_count = 0;
      for (const auto& kv : pairs)
        if (kv.second > best_count || (kv.second == best_count && kv.second > 0 && kv.first < best))
          best = kv.first, best_count = kv.second;
      if (best_count < 2) break;  // nothing left worth merging: a smaller vocabulary
      const int32_t a = static_cast<int32_t>(best >> 32), b = static_cast<int32_t>(best & 0xffffffffu);
      const int32_t t = static_cast<int32_t>(256 + m);
      bpe.merges_.emplace_back(a, b);
      for (size_t w = 0; w < words.size(); ++w) {
        std::vector<int32_t>& s = words[w];
        bool has = false;
        for (size_t j = 0; j + 1 < s.size() && !has; ++j) has = s[j] == a && s[j + 1] == b;
        if (!has) continue;
        add_pairs(s, -freq[w]);
        std::vector<int32_t> merged;
        merged.reserve(s.size());
        for (size_t j = 0; j < s.size(); ++j) {
          if (j + 1 < s.size() && s[j] == a && s[j + 1] == b) {
            merged.push_back(t);
            ++j;
          } else {
            merged.push_back(s[j]);
          }
        }
        s.swap(merged);
        add_pairs(s, freq[w]);
      }
      for (auto it = pairs.begin(); it != pairs.end();) it = it->second == 0 ? pairs.erase(it) : std::next(it);
    }
  }
  bpe.finish();
  return bpe;
}

void Bpe::finish() {
  ranks_.clear();
  bytes_.assign(256, std::string());
  for (int i = 0; i < 256; ++i) bytes_[i] = std::string(1, static_cast<char>(i));
  for (size_t m = 0; m < merges_.size(); ++m) {
    ranks_[key(merges_[m].first, merges_[m].second)] = static_cast<int32_t>(m);
    bytes_.push_back(bytes_[merges_[m].first] + bytes_[merges_[m].second]);
  }
}

std::vector<int32_t> Bpe::encode_piece(const std::string& piece) const {
  std::vector<int32_t> s(piece.begin(), piece.end());
  for (int32_t& t : s) t &= 0xff;
  while (s.size() > 1) {
    int32_t best_rank = -1;
    for (size_t j = 0; j + 1 < s.size(); ++j) {
      const auto it = ranks_.find(key(s[j], s[j + 1]));
      if (it != ranks_.end() && (best_rank < 0 || it->second < best_rank)) best_rank = it->second;
    }
    if (best_rank < 0) break;
    const auto& mp = merges_[best_rank];
    std::vector<int32_t> merged;
    merged.reserve(s.size());
    for (size_t j = 0; j < s.size(); ++j) {
      if (j + 1 < s.size() && s[j] == mp.first && s[j + 1] == mp.second) {
        merged.push_back(256 + best_rank);
        ++j;
      } else {
        merged.push_back(s[j]);
      }
    }
    s.swap(merged);
  }
  return s;
}

std::vector<int32_t> Bpe::encode(const std::string& text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 2 + 1);
  if (merges_.empty()) {
    for (unsigned char c : text) out.push_back(c);
    return out;
  }
  std::unordered_map<std::string, std::vector<int32_t>> cache;
  for (const std::string& p : split_pieces(text)) {
    auto it = cache.find(p);
    if (it == cache.end()) it = cache.emplace(p, encode_piece(p)).first;
    out.insert(out.end(), it->second.begin(), it->second.end());
  }
  return out;
}

std::string Bpe::decode(const std::vector<int32_t>& tokens) const {
  std::string s;
  for (int32_t t : tokens) s += bytes_.at(static_cast<size_t>(t));
  return s;
}

}  // namespace gpt
