// The low-bit collectives of the sharded step (compressed_wire.h).
#include "compressed_wire.h"

#include "../tensors/wire_ops.h"

namespace lowbit {
namespace distributed {

namespace {

std::string fmt(const WireCompression& w) { return format_name(w.format); }

}  // namespace

int64_t check_wire_compression(const WireCompression& w, const char* what) {
  TORCH_CHECK(is_valid_format(static_cast<int32_t>(w.format)), what, ".format is ", static_cast<int32_t>(w.format),
              ", not a QuantFormat; one of ", all_format_names());
  TORCH_CHECK(format_is_signed(w.format), what, ".format ", format_name(w.format),
              " is unsigned; gradients and updates need a signed format (Dyn8Signed, DE4Signed, FP8E4M3, ...)");
  const int64_t block = w.block_size == 0 ? default_block_size(w.format) : w.block_size;
  TORCH_CHECK(is_valid_block_size(block) && block <= 256, what, ".block_size is ", w.block_size,
              "; expected 0 (the format's default) or a power of two in [32, 256], so every rank's chunk is whole blocks");
  return block;
}

int64_t wire_row_bytes(const WireCompression& w, int64_t chunk) {
  return ops::wire_row_bytes(w.format, chunk, check_wire_compression(w, "WireCompression"));
}

void send_gradient_chunks(Communicator& comm, const WireCompression& w, const at::Tensor& flat_grad,
                          const at::Tensor& residual, const at::Tensor& send, const at::Tensor& recv) {
  if (!w.error_feedback) {
    ops::wire_pack_(flat_grad, send, fmt(w), w.block_size);
  } else {
    const at::Tensor x = at::add(flat_grad.to(at::kFloat), residual);  // flat_grad itself stays as it was
    ops::wire_pack_(x, send, fmt(w), w.block_size);
    // residual = x - decoded; the own chunk is never sent, so it keeps nothing.
    ops::wire_unpack_(send, residual, fmt(w), w.block_size);
    residual.neg_().add_(x);
    const int64_t chunk = residual.numel() / comm.size();
    residual.narrow(0, comm.rank() * chunk, chunk).zero_();
  }
  at::Tensor out = recv;
  comm.all_to_all(send, out);
}

void sum_gradient_chunks(const WireCompression& w, int rank, const at::Tensor& own, const at::Tensor& recv,
                         const at::Tensor& sum, const at::Tensor& scratch) {
  for (int64_t r = 0; r < recv.size(0); ++r) {
    at::Tensor row;
    if (r == rank) {
      row = own;
    } else {
      ops::wire_unpack_(recv.narrow(0, r, 1), scratch, fmt(w), w.block_size);
      row = scratch;
    }
    if (r == 0)
      sum.copy_(row);
    else
      sum.add_(row);
  }
}

void pack_update(const WireCompression& w, int rank, const at::Tensor& now, const at::Tensor& before,
                 const at::Tensor& residual, const at::Tensor& rows) {
  // now - before first: two close values, whose difference float32 holds exactly, then the residual.
  const at::Tensor step = at::sub(now.to(at::kFloat), before.to(at::kFloat));
  if (w.error_feedback)
    residual.add_(step);
  else
    residual.copy_(step);
  ops::wire_pack_(residual, rows.narrow(0, rank, 1), fmt(w), w.block_size);
}

void apply_updates(const WireCompression& w, int rank, const at::Tensor& flat_param, const at::Tensor& before,
                   const at::Tensor& residual, const at::Tensor& rows, const at::Tensor& scratch) {
  const int64_t chunk = scratch.numel();
  for (int64_t r = 0; r < rows.size(0); ++r) {
    ops::wire_unpack_(rows.narrow(0, r, 1), scratch, fmt(w), w.block_size);
    at::Tensor mine = flat_param.narrow(0, r * chunk, chunk);
    const at::Tensor& base = r == rank ? before : mine;
    const at::Tensor stored = at::add(base.to(at::kFloat), scratch).to(flat_param.scalar_type());
    // What the replicas still lack: the target (before + what was to be sent) minus what they now
    // hold, the two close values subtracted first.
    if (r == rank && w.error_feedback) residual.add_(at::sub(before.to(at::kFloat), stored.to(at::kFloat)));
    mine.copy_(stored);
  }
}

}  // namespace distributed
}  // namespace lowbit
