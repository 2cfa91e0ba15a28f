// A flat buffer whose memory comes and goes while its tensor, and every view of it, stays: the
// fully sharded module's gathered parameters and gradient buffers hold memory only while a unit
// needs them. The views autograd saved in forward (a weight's transpose) share the buffer's
// storage object, so refilling that storage, not swapping in another, is what they see again in
// backward. The parameters themselves point at a placeholder while released, whose every read is
// an error that says why (a storage without memory would be read as address 0).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>

#include <string>

namespace lowbit {
namespace distributed {

inline bool storage_resident(const at::Tensor& t) { return t.storage().nbytes() > 0 || t.numel() == 0; }

// Drops the storage's memory (to the caching allocator on a GPU); the tensor keeps its sizes.
inline void release_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}

// Memory for every element of `t` (a contiguous tensor at offset 0 of its storage), contents undefined.
inline void allocate_storage(const at::Tensor& t) {
  if (storage_resident(t)) return;
  TORCH_INTERNAL_ASSERT(t.is_contiguous() && t.storage_offset() == 0);
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  const size_t nbytes = static_cast<size_t>(t.numel()) * t.element_size();
  s->set_data_ptr_noswap(s->allocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
}

// A tensor shaped and typed as `like` whose data cannot be read or written: the error is `message`.
inline at::Tensor unreadable_like(const at::Tensor& like, const std::string& message) {
  auto storage = c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), static_cast<int64_t>(like.numel() * like.element_size()),
      at::DataPtr(nullptr, like.device()), nullptr, false);
  c10::StorageImpl* impl = storage.get();
  at::Tensor t = at::empty({0}, like.options()).set_(at::Storage(std::move(storage)), 0, like.sizes(), like.strides());
  impl->release_data_and_set_meta_custom_data_ptr_error_msg_(message);  // after set_, which reads the address
  return t;
}

}  // namespace distributed
}  // namespace lowbit
