// Corpus loading, the train / validation split, tokenization and batches.
#include "data.h"

#include <sys/stat.h>

#include <algorithm>
#include <dirent.h>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

namespace gpt {

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("--data " + path + ": cannot read the file");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// splitmix64: a well-mixed 64-bit value from (seed, step).
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

at::Tensor to_tensor(const std::vector<int32_t>& t) {
  at::Tensor out = at::empty({static_cast<int64_t>(t.size())}, at::kLong);
  int64_t* p = out.data_ptr<int64_t>();
  for (size_t i = 0; i < t.size(); ++i) p[i] = t[i];
  return out;
}

// Windows of context + 1 tokens at `offsets` of `tokens`, as {inputs, targets}.
std::pair<at::Tensor, at::Tensor> windows(const at::Tensor& tokens, const std::vector<int64_t>& offsets,
                                          int64_t context, at::Device device) {
  const int64_t b = static_cast<int64_t>(offsets.size());
  at::Tensor w = at::empty({b, context + 1}, at::kLong);
  const int64_t* src = tokens.data_ptr<int64_t>();
  int64_t* dst = w.data_ptr<int64_t>();
  for (int64_t i = 0; i < b; ++i) std::copy(src + offsets[i], src + offsets[i] + context + 1, dst + i * (context + 1));
  w = w.to(device);
  return {w.narrow(1, 0, context), w.narrow(1, 1, context)};
}

}  // namespace

uint64_t fnv1a(const void* data, size_t n, uint64_t h) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

std::string read_corpus(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0)
    throw std::runtime_error("--data " + path + ": no such file or folder" +
                             (path == kDefaultData ? " (install the Debian package `fortunes`, or pass --data)" : ""));
  if (!S_ISDIR(st.st_mode)) return read_file(path);
  std::vector<std::string> names;
  DIR* d = opendir(path.c_str());
  if (!d) throw std::runtime_error("--data " + path + ": cannot list the folder");
  while (dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    struct stat fs {};
    if (n.find('.') != std::string::npos || lstat((path + "/" + n).c_str(), &fs) != 0 || !S_ISREG(fs.st_mode)) continue;
    names.push_back(n);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  std::string text;
  for (const std::string& n : names) text += read_file(path + "/" + n);
  if (text.empty()) throw std::runtime_error("--data " + path + ": no data files (regular files without '.' in the name)");
  return text;
}

Corpus load_corpus(const std::string& path, int64_t limit, int64_t vocab, int64_t val_every) {
  std::string text = read_corpus(path);
  if (limit > 0 && static_cast<int64_t>(text.size()) > limit) text.resize(static_cast<size_t>(limit));
  // ---- split: chunks of >= 4 KiB ending at a line end; every val_every-th one is validation
  std::string train, val;
  size_t pos = 0;
  for (int64_t k = 0; pos < text.size(); ++k) {
    size_t end = std::min(text.size(), pos + 4096);
    while (end < text.size() && text[end - 1] != '\n') ++end;
    (k % val_every == val_every - 1 ? val : train).append(text, pos, end - pos);
    pos = end;
  }
  if (val.empty()) throw std::runtime_error("--data " + path + ": too little text for a validation split (" +
                                            std::to_string(text.size()) + " bytes)");
  Corpus c;
  c.bpe = Bpe::train(train, vocab);
  c.train = to_tensor(c.bpe.encode(train));
  c.val = to_tensor(c.bpe.encode(val));
  c.train_bytes = static_cast<int64_t>(train.size());
  c.val_bytes = static_cast<int64_t>(val.size());
  c.digest = fnv1a(text.data(), text.size());
  const int64_t v = c.bpe.vocab();
  c.digest = fnv1a(&v, sizeof v, c.digest);
  return c;
}

std::pair<at::Tensor, at::Tensor> train_batch(const Corpus& c, int64_t batch, int64_t context, uint64_t seed,
                                              int64_t step, at::Device device) {
  const int64_t span = c.train.numel() - context - 1;
  TORCH_CHECK(span > 0, "--context ", context, ": the training text has only ", c.train.numel(), " tokens");
  std::mt19937_64 rng(mix(mix(seed) ^ static_cast<uint64_t>(step)));
  std::vector<int64_t> offsets(static_cast<size_t>(batch));
  for (int64_t& o : offsets) o = static_cast<int64_t>(rng() % static_cast<uint64_t>(span + 1));
  return windows(c.train, offsets, context, device);
}

std::pair<at::Tensor, at::Tensor> val_batch(const Corpus& c, int64_t batch, int64_t context, int64_t i, int64_t n,
                                            at::Device device) {
  const int64_t span = c.val.numel() - context - 1;
  TORCH_CHECK(span > 0, "--context ", context, ": the validation text has only ", c.val.numel(), " tokens");
  const int64_t windows_total = batch * n;
  std::vector<int64_t> offsets(static_cast<size_t>(batch));
  for (int64_t j = 0; j < batch; ++j) {
    const int64_t w = i * batch + j;
    offsets[j] = windows_total > 1 ? span * w / (windows_total - 1) : 0;
  }
  return windows(c.val, offsets, context, device);
}

}  // namespace gpt
