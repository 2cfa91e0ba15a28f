// The low-bit collectives of the sharded step (ShardedOptions::gradient_wire / update_wire), on one
// bucket's flat buffers. Rows are ranks' chunks; each is quantized blockwise (tensors/wire_ops.h)
// and the receiver works in float32 in a fixed order, so a run gives the same bits for the same
// world size and inputs (DESIGN.md: the wire).
//
// Gradients (ZeRO++'s qgZ, arXiv 2306.10209, without its hierarchy): every chunk but the rank's own
// is quantized and exchanged (all-to-all); the owner adds, in rank order, its own chunk exact and
// the others' decoded ones. With error feedback what a chunk lost to quantization is added to the
// same chunk next step (one float32 per element of the bucket).
// Updates: the owner quantizes new - old of its chunk (plus, with error feedback, what the replicas
// still lack from earlier steps) and every rank, the owner included, adds the decoded update to its
// copy: all replicas stay identical, and lag the exact parameters by the residual only.
#pragma once

#include <ATen/ATen.h>

#include "../kernels/common/format_table.h"

#include "communicator.h"

namespace lowbit {
namespace distributed {

// One leg's compression (ShardedOptions::gradient_wire / update_wire).
struct WireCompression {
  // Any signed format of the state table: Dyn8Signed (8 bits), DE4Signed (4 bits), FP8E4M3, ...
  QuantFormat format = QuantFormat::Dyn8Signed;
  // Elements per absmax: a power of two in [32, 256] (a chunk is a whole number of 256-element
  // units); 0: the format's default.
  int64_t block_size = 0;
  // Carry what quantization lost into the next step (see above).
  bool error_feedback = false;

  static WireCompression gradients(QuantFormat f = QuantFormat::Dyn8Signed) { return {f, 0, false}; }
  static WireCompression updates(QuantFormat f = QuantFormat::Dyn8Signed) { return {f, 0, true}; }
};

// `what` names the option in errors ("ShardedOptions::gradient_wire"); returns the block size used.
int64_t check_wire_compression(const WireCompression& w, const char* what);

// Bytes of one rank's packed chunk.
int64_t wire_row_bytes(const WireCompression& w, int64_t chunk);

// Gradient leg, sender: quantizes `flat_grad` (world rows; with error feedback plus `residual`,
// float32 like flat_grad, which then keeps what was lost, 0 on the own row) into `send` and
// exchanges it into `recv` (both uint8 [world, row bytes]).
void send_gradient_chunks(Communicator& comm, const WireCompression& w, const at::Tensor& flat_grad,
                          const at::Tensor& residual, const at::Tensor& send, const at::Tensor& recv);
// Gradient leg, receiver (after the exchange completed on the caller's stream): `sum` (float32
// [chunk]) = the ranks' chunks added in rank order, this rank's `own` (flat_grad's chunk) exact.
// `scratch`: float32 [chunk].
void sum_gradient_chunks(const WireCompression& w, int rank, const at::Tensor& own, const at::Tensor& recv,
                         const at::Tensor& sum, const at::Tensor& scratch);

// Update leg, owner, after its update: `residual` (float32 [chunk]) becomes the update to send,
// now - before (+ the residual carried with error feedback), packed into row `rank` of `rows`.
void pack_update(const WireCompression& w, int rank, const at::Tensor& now, const at::Tensor& before,
                 const at::Tensor& residual, const at::Tensor& rows);
// Update leg, every rank, after the all-gather of `rows` completed: chunk r of `flat_param` gets its
// decoded update added (this rank's chunk to `before`, its value before the step); with error
// feedback `residual` keeps what the replicas lack. `scratch`: float32 [chunk].
void apply_updates(const WireCompression& w, int rank, const at::Tensor& flat_param, const at::Tensor& before,
                   const at::Tensor& residual, const at::Tensor& rows, const at::Tensor& scratch);

}  // namespace distributed
}  // namespace lowbit
