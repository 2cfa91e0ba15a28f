// Fragment checkpoints: write each holder's pieces, read every writer's file, check the whole, then
// load the ranges each optimizer needs. POSIX directory calls, not std::filesystem (the torch
// wheel exports std::filesystem symbols that clash with the toolchain's).
#include "sharded_checkpoint.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <map>
#include <torch/serialize/archive.h>

#include <lowbit/optim/fragment_access.h>

#include "fragment_state.h"
#include "sharded_optimizer.h"

namespace lowbit {
namespace distributed {

using optim::FragmentAccess;

namespace {

constexpr int64_t kMagic = 0x6C6F77626672ll;  // "lowbfr"

struct Meta {  // the int64 header of one fragment
  int64_t group, index, offset, numel, param_numel, format, block_size, nslots, step, overflow;
};

struct FileFragment {
  Meta meta;
  std::vector<kernels::SlotType> slots;
  std::vector<at::Tensor> tensors;  // as append_state_range gives them
  std::string file;
};

struct Holder {  // what one writer saves: its fragments (piece + state) and the optimizer-wide values
  std::vector<std::pair<Fragment, bool>> pieces;  // bool: the piece has state
};

void write_file(const std::string& path, int rank, int world_size, uint64_t seed, int64_t skipped,
                const std::vector<const Fragment*>& frags) {
  torch::serialize::OutputArchive ar;
  ar.write("header", at::tensor(std::vector<int64_t>{kMagic, kFragmentFormatVersion, rank, world_size,
                                                     static_cast<int64_t>(seed), static_cast<int64_t>(frags.size()),
                                                     skipped}));
  for (size_t i = 0; i < frags.size(); ++i) {
    const Fragment& f = *frags[i];
    const optim::ParamState& st = f.state;
    const at::Tensor c = st.counters.cpu();
    const std::string key = "f" + std::to_string(i);
    ar.write(key + ".meta", at::tensor(std::vector<int64_t>{
                                static_cast<int64_t>(f.group), static_cast<int64_t>(f.index), f.offset, f.numel,
                                f.param_numel, static_cast<int64_t>(st.format), st.block_size,
                                static_cast<int64_t>(st.slots.size()), c.data_ptr<int64_t>()[0], c.data_ptr<int64_t>()[1]}));
    std::vector<int64_t> slots;
    for (const auto& s : st.slots) {
      slots.push_back(static_cast<int64_t>(s.type.storage));
      slots.push_back(static_cast<int64_t>(s.type.format));
    }
    ar.write(key + ".slots", at::tensor(slots));
    std::vector<at::Tensor> ts;
    append_state_range(st, 0, f.numel, ts);
    for (size_t k = 0; k < ts.size(); ++k) ar.write(key + ".t" + std::to_string(k), ts[k].cpu().contiguous());
  }
  ar.save_to(path);
}

struct FileHeader {
  int64_t version, rank, world_size, seed, count, skipped;
};

std::vector<FileFragment> read_file(const std::string& path, FileHeader* h) {
  torch::serialize::InputArchive ar;
  try {
    ar.load_from(path);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "load fragments: cannot read ", path, ": ", e.what_without_backtrace());
  }
  at::Tensor header;
  TORCH_CHECK(ar.try_read("header", header) && header.numel() == 7 && header.data_ptr<int64_t>()[0] == kMagic,
              "load fragments: ", path, " is not a lowbit fragment file");
  const int64_t* x = header.data_ptr<int64_t>();
  *h = {x[1], x[2], x[3], x[4], x[5], x[6]};
  TORCH_CHECK(h->version == kFragmentFormatVersion, "load fragments: ", path, " has format version ", h->version,
              "; this lowbit reads version ", kFragmentFormatVersion);
  std::vector<FileFragment> out;
  for (int64_t i = 0; i < h->count; ++i) {
    const std::string key = "f" + std::to_string(i);
    FileFragment f;
    f.file = path;
    at::Tensor meta, slots;
    TORCH_CHECK(ar.try_read(key + ".meta", meta) && meta.numel() == 10 && ar.try_read(key + ".slots", slots),
                "load fragments: ", path, ": fragment ", i, " is incomplete");
    const int64_t* m = meta.data_ptr<int64_t>();
    f.meta = {m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7], m[8], m[9]};
    TORCH_CHECK(slots.numel() == 2 * f.meta.nslots, "load fragments: ", path, ": fragment ", i, " has a bad slot list");
    int64_t ntensors = 0;
    for (int64_t k = 0; k < f.meta.nslots; ++k) {
      kernels::SlotType t;
      t.storage = static_cast<kernels::SlotStorage>(slots.data_ptr<int64_t>()[2 * k]);
      t.format = static_cast<QuantFormat>(slots.data_ptr<int64_t>()[2 * k + 1]);
      ntensors += t.storage == kernels::SlotStorage::Quant ? 2 : t.storage == kernels::SlotStorage::None ? 0 : 1;
      f.slots.push_back(t);
    }
    for (int64_t k = 0; k < ntensors; ++k) {
      at::Tensor t;
      TORCH_CHECK(ar.try_read(key + ".t" + std::to_string(k), t), "load fragments: ", path, ": fragment ", i,
                  " misses state tensor ", k);
      f.tensors.push_back(t);
    }
    out.push_back(std::move(f));
  }
  return out;
}

// Every writer's file of `prefix`: exactly ranks 0..N-1 of one N, or an error naming what is wrong.
std::vector<std::string> writer_files(const std::string& prefix) {
  const auto slash = prefix.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : prefix.substr(0, slash == 0 ? 1 : slash);
  const std::string base = (slash == std::string::npos ? prefix : prefix.substr(slash + 1)) + ".rank-";
  DIR* d = opendir(dir.c_str());
  TORCH_CHECK(d, "load fragments: cannot open the directory ", dir, " of ", prefix);
  std::map<int, int> ranks;  // rank -> world size
  int world = -1;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.compare(0, base.size(), base) != 0) continue;
    int r = -1, n = -1;
    char tail = 0;
    if (std::sscanf(name.c_str() + base.size(), "%d-of-%d%c", &r, &n, &tail) != 2) continue;
    if (world >= 0 && n != world) {
      closedir(d);
      TORCH_CHECK(false, "load fragments: ", prefix, " has files of ", world, " and of ", n,
                  " writers; remove the stale ones");
    }
    world = n;
    ranks[r] = n;
  }
  closedir(d);
  TORCH_CHECK(world > 0, "load fragments: no fragment files ", prefix, ".rank-*-of-*");
  std::vector<std::string> files;
  for (int r = 0; r < world; ++r) {
    TORCH_CHECK(ranks.count(r), "load fragments: the file of rank ", r, " of ", world, " is missing: ",
                fragment_file(prefix, r, world));
    files.push_back(fragment_file(prefix, r, world));
  }
  return files;
}

// The whole state of one parameter from all fragments of it, checked against what the optimizer
// would create for it (format, block size, slots) and for exact coverage.
struct Whole {
  optim::ParamState state;
  bool present = false;
};

std::map<std::pair<int64_t, int64_t>, Whole> assemble(const optim::LowbitOptimizer& o, const std::string& prefix,
                                                      uint64_t* seed, int64_t* skipped) {
  std::map<std::pair<int64_t, int64_t>, std::vector<FileFragment>> by_param;
  bool first = true;
  for (const std::string& file : writer_files(prefix)) {
    FileHeader h;
    for (FileFragment& f : read_file(file, &h)) by_param[{f.meta.group, f.meta.index}].push_back(std::move(f));
    if (first) {
      *seed = static_cast<uint64_t>(h.seed);
      *skipped = h.skipped;
    }
    TORCH_CHECK(static_cast<uint64_t>(h.seed) == *seed, "load fragments: ", file,
                " has another stochastic-rounding seed than rank 0's file");
    first = false;
  }
  const auto& groups = o.param_groups();
  std::map<std::pair<int64_t, int64_t>, Whole> out;
  for (auto& kv : by_param) {
    const int64_t gi = kv.first.first, i = kv.first.second;
    auto& frags = kv.second;
    TORCH_CHECK(gi >= 0 && gi < static_cast<int64_t>(groups.size()) && i >= 0 &&
                    i < static_cast<int64_t>(groups[gi].params().size()),
                "load fragments: ", frags[0].file, " holds parameter ", i, " of group ", gi,
                ", which this optimizer does not have");
    const at::Tensor& p = groups[gi].params()[i];
    const optim::StateLayout want = FragmentAccess::layout(o, static_cast<size_t>(gi), p);
    std::sort(frags.begin(), frags.end(), [](const FileFragment& a, const FileFragment& b) { return a.meta.offset < b.meta.offset; });
    int64_t next = 0;
    for (const FileFragment& f : frags) {
      const auto where = [&] { return c10::str("parameter ", i, " of group ", gi, " (", f.file, ")"); };
      TORCH_CHECK(f.meta.param_numel == p.numel(), "load fragments: ", where(), " has ", f.meta.param_numel,
                  " elements in the checkpoint but ", p.numel(), " here");
      TORCH_CHECK(f.meta.offset >= next, "load fragments: ", where(), ": elements ", f.meta.offset, "..",
                  std::min(next, f.meta.offset + f.meta.numel), " are in two fragments (duplicated fragment)");
      TORCH_CHECK(f.meta.offset == next, "load fragments: ", where(), ": elements ", next, "..", f.meta.offset,
                  " are in no fragment (missing fragment)");
      TORCH_CHECK(f.meta.format == static_cast<int64_t>(want.format) && f.meta.block_size == want.block_size &&
                      f.slots.size() == want.slots.size(),
                  "load fragments: ", where(), " was saved with state format ", f.meta.format, " and block size ",
                  f.meta.block_size, " but this optimizer uses ", static_cast<int64_t>(want.format), " and ",
                  want.block_size);
      for (size_t k = 0; k < want.slots.size(); ++k)
        TORCH_CHECK(f.slots[k] == want.slots[k], "load fragments: ", where(), ": state slot ", k,
                    " is stored as ", kernels::slot_type_name(f.slots[k]), " but this optimizer stores it as ",
                    kernels::slot_type_name(want.slots[k]));
      TORCH_CHECK(f.meta.step == frags[0].meta.step, "load fragments: ", where(), ": fragments at different steps (",
                  f.meta.step, " and ", frags[0].meta.step, ")");
      next = f.meta.offset + f.meta.numel;
    }
    TORCH_CHECK(next == p.numel(), "load fragments: parameter ", i, " of group ", gi, ": elements ", next, "..",
                p.numel(), " are in no fragment (missing fragment)");
    // Concatenate slot by slot (every fragment but the last is a whole number of blocks).
    Whole w;
    w.present = true;
    optim::ParamState& st = w.state;
    st.format = want.format;
    st.block_size = want.block_size;
    st.counters = at::tensor(std::vector<int64_t>{frags[0].meta.step, 0});
    st.slots.resize(want.slots.size());
    size_t t = 0;
    for (size_t k = 0; k < want.slots.size(); ++k) {
      optim::StateSlot& s = st.slots[k];
      s.type = want.slots[k];
      const int per = s.type.storage == kernels::SlotStorage::Quant ? 2 : s.type.storage == kernels::SlotStorage::None ? 0 : 1;
      std::vector<at::Tensor> a, b;
      for (const FileFragment& f : frags) {
        if (per >= 1) a.push_back(f.tensors.at(t));
        if (per == 2) b.push_back(f.tensors.at(t + 1));
      }
      if (per == 1) s.dense = at::cat(a).to(p.device());
      if (per == 2)
        s.quantized = QTensor(at::cat(a).to(p.device()), at::cat(b).to(p.device()), {p.numel()}, s.type.format,
                              st.block_size);
      t += per;
    }
    st.counters = st.counters.to(p.device());
    out[kv.first] = std::move(w);
  }
  return out;
}

// Elements [begin, begin + len) of a whole state as a fresh state of its own.
optim::ParamState slice_state(const optim::ParamState& whole, int64_t begin, int64_t len) {
  optim::ParamState st;
  st.format = whole.format;
  st.block_size = whole.block_size;
  st.counters = whole.counters.clone();
  st.slots.resize(whole.slots.size());
  for (size_t k = 0; k < whole.slots.size(); ++k) {
    const optim::StateSlot& w = whole.slots[k];
    optim::StateSlot& s = st.slots[k];
    s.type = w.type;
    if (w.type.storage == kernels::SlotStorage::Quant) {
      std::vector<at::Tensor> ts;
      optim::ParamState one;
      one.block_size = whole.block_size;
      one.slots = {w};
      append_state_range(one, begin, len, ts);
      s.quantized = QTensor(ts[0].clone(), ts[1].clone(), {len}, w.type.format, whole.block_size);
    } else if (w.type.storage != kernels::SlotStorage::None) {
      s.dense = w.dense.narrow(0, begin, len).clone();
    }
  }
  return st;
}

}  // namespace

std::string fragment_file(const std::string& prefix, int rank, int world_size) {
  return prefix + ".rank-" + std::to_string(rank) + "-of-" + std::to_string(world_size);
}

void save_fragments(const optim::LowbitOptimizer& o, const std::string& prefix) {
  std::vector<Fragment> frags;
  const auto& groups = o.param_groups();
  for (size_t gi = 0; gi < groups.size(); ++gi)
    for (size_t i = 0; i < groups[gi].params().size(); ++i) {
      const at::Tensor& p = groups[gi].params()[i];
      const optim::ParamState* st = FragmentAccess::state(o, p);
      if (!st) continue;
      Fragment f;
      f.group = gi;
      f.index = i;
      f.offset = 0;
      f.numel = f.param_numel = p.numel();
      f.state = *st;
      frags.push_back(std::move(f));
    }
  std::vector<const Fragment*> ptrs;
  for (const Fragment& f : frags) ptrs.push_back(&f);
  write_file(fragment_file(prefix, 0, 1), 0, 1, FragmentAccess::seed(o), FragmentAccess::skipped(o), ptrs);
}

void load_fragments(optim::LowbitOptimizer& o, const std::string& prefix) {
  uint64_t seed = 0;
  int64_t skipped = 0;
  auto wholes = assemble(o, prefix, &seed, &skipped);  // throws before anything is changed
  const auto& groups = o.param_groups();
  for (auto& kv : wholes)
    FragmentAccess::set_state(o, groups[kv.first.first].params()[kv.first.second], std::move(kv.second.state));
  FragmentAccess::set_seed(o, seed);
  FragmentAccess::set_skipped(o, skipped);
}

void ShardedOptimizer::save(const std::string& prefix) const {
  std::vector<const Fragment*> ptrs;
  for (const Fragment& f : fragments_)
    if (f.state.counters.defined()) ptrs.push_back(&f);
  write_file(fragment_file(prefix, comm_->rank(), comm_->size()), comm_->rank(), comm_->size(),
             FragmentAccess::seed(*optimizer_), skipped_steps(), ptrs);
  comm_->barrier();  // every file is written when save returns on any rank
}

void ShardedOptimizer::load(const std::string& prefix) {
  uint64_t seed = 0;
  int64_t skipped = 0;
  // Every rank checks the files whole before any rank changes anything: one all_reduce of failures.
  std::map<std::pair<int64_t, int64_t>, Whole> wholes;
  std::string error;
  try {
    wholes = assemble(*optimizer_, prefix, &seed, &skipped);
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  }
  at::Tensor failed = at::full({1}, error.empty() ? 0 : 1, at::TensorOptions().dtype(at::kInt).device(device_));
  comm_->all_reduce(failed, ReduceOp::Sum);
  const int64_t failures = failed.cpu().item<int64_t>();
  TORCH_CHECK(error.empty(), error, " (rank ", comm_->rank(), "; nothing was loaded)");
  TORCH_CHECK(failures == 0, "ShardedOptimizer::load: ", failures, " other rank(s) could not load ", prefix,
              "; nothing was loaded");
  for (Fragment& f : fragments_) {
    auto it = wholes.find({static_cast<int64_t>(f.group), static_cast<int64_t>(f.index)});
    f.state = it == wholes.end() ? optim::ParamState{} : slice_state(it->second.state, f.offset, f.numel);
  }
  FragmentAccess::set_seed(*optimizer_, seed);
  skipped_ = at::Tensor();
  skipped_loaded_ = skipped;
}

}  // namespace distributed
}  // namespace lowbit
