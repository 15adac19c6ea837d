// The page allocator of a paged KV cache, as a serving engine's block
// manager has it: a fixed pool of `num_blocks` pages handed out one at a
// time as sequences grow and returned when the last sequence holding them
// lets go. Pages are reference-counted so that sequences can share a common
// history (beam search, parallel sampling, a cached prefix): full pages are
// never written again and stay shared; a shared partial page is copied before
// one of its holders writes into it (copy-on-write, `writable`).
//
// Host bookkeeping only (no memory is touched): the `metrale` command's
// serve-sim and the Python package's transformers cache both use it.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace metrale {

class BlockAllocator {
 public:
  // Throws InvalidArgument when num_blocks < 0.
  explicit BlockAllocator(int32_t num_blocks);

  // A free page id in [0, total()) with one reference, or nullopt when every
  // page is in use.
  std::optional<int32_t> allocate();

  // One more holder of `block` (a page in use): it goes back to the pool
  // only when every holder has freed it.
  void share(int32_t block);

  // Drops one reference to `block`; returns true when that was the last one
  // and the page went back to the pool. Throws InvalidArgument when `block`
  // is not a page of this pool or is not in use (a double free): in an
  // engine either is a bookkeeping bug that would later let two sequences
  // share a page unknowingly, so it must fail loudly, not be ignored.
  bool free(int32_t block);

  // Copy-on-write: the page a holder of `block` may write into. `block`
  // itself when the caller is its only holder; else the caller's reference
  // moves to a fresh page (returned; the caller copies the contents over),
  // or nullopt when no page is free (the reference stays on `block`).
  // Throws InvalidArgument when `block` is not in use.
  std::optional<int32_t> writable(int32_t block);

  int32_t total() const { return int32_t(refs_.size()); }
  int32_t num_free() const { return int32_t(free_list_.size()); }
  int32_t num_used() const { return total() - num_free(); }
  bool is_used(int32_t block) const { return block >= 0 && block < total() && refs_[size_t(block)] > 0; }
  // Holders of `block` (0: free; -1 for an id outside the pool).
  int32_t ref_count(int32_t block) const { return block >= 0 && block < total() ? refs_[size_t(block)] : -1; }

 private:
  void check_used(int32_t block, const char* what) const;

  // LIFO free list: a just-freed page is reused first (warm in cache, as in
  // vLLM's block pool); refs_ makes every check O(1).
  std::vector<int32_t> free_list_;
  std::vector<int32_t> refs_;
};

}  // namespace metrale
