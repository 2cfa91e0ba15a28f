// Reads the gzip'd IDX files of (Fashion-)MNIST, e.g. Debian's dataset-fashion-mnist.
#pragma once

#include <torch/torch.h>
#include <zlib.h>

#include <string>
#include <vector>

namespace lowbit_examples {

inline const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// Returns a uint8 tensor shaped by the file's dimensions ([N, 28, 28] images or [N] labels).
inline at::Tensor read_idx_gz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  TORCH_CHECK(f != nullptr, "cannot open ", path, " (install Debian's dataset-fashion-mnist)");
  std::vector<uint8_t> data;
  uint8_t chunk[1 << 16];
  int got;
  while ((got = gzread(f, chunk, sizeof(chunk))) > 0) data.insert(data.end(), chunk, chunk + got);
  gzclose(f);
  TORCH_CHECK(data.size() >= 4 && data[0] == 0 && data[1] == 0 && data[2] == 0x08, path,
              ": not an IDX file of unsigned bytes");
  const int ndim = data[3];
  TORCH_CHECK(data.size() >= size_t(4 + 4 * ndim), path, ": truncated header");
  std::vector<int64_t> dims;
  int64_t total = 1;
  for (int d = 0; d < ndim; ++d) {
    const uint8_t* p = data.data() + 4 + 4 * d;
    dims.push_back((int64_t(p[0]) << 24) | (p[1] << 16) | (p[2] << 8) | p[3]);
    total *= dims.back();
  }
  const size_t offset = 4 + 4 * ndim;
  TORCH_CHECK(data.size() == offset + size_t(total), path, ": expected ", total, " bytes of data, found ",
              data.size() - offset);
  return at::from_blob(data.data() + offset, dims, at::kByte).clone();
}

}  // namespace lowbit_examples
