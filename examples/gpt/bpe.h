// A byte-level BPE tokenizer trained at start-up (GPT-2 style: merges never cross a word boundary).
// Tokens 0..255 are bytes; token 256 + m is merge m. Training is deterministic (ties go to the
// smallest pair), so every run on the same text and vocabulary gets the same tokens.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace gpt {

class Bpe {
 public:
  // vocab = 256 + number of merges; 256: plain bytes.
  static Bpe train(const std::string& text, int64_t vocab);

  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& tokens) const;
  int64_t vocab() const { return 256 + static_cast<int64_t>(merges_.size()); }
  const std::string& token_bytes(int32_t t) const { return bytes_[t]; }

 private:
  void finish();  // builds ranks_ and bytes_ from merges_
  std::vector<int32_t> encode_piece(const std::string& piece) const;

  std::vector<std::pair<int32_t, int32_t>> merges_;
  std::unordered_map<uint64_t, int32_t> ranks_;  // pair -> merge index
  std::vector<std::string> bytes_;               // token -> the bytes it stands for
};

// Splits text into pieces: an optional leading space plus a run of letters, of digits or of other
// symbols; or a run of whitespace. Concatenated, the pieces are the text.
std::vector<std::string> split_pieces(const std::string& text);

}  // namespace gpt
