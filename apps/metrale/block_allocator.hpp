// The page allocator of a paged KV cache, as a serving engine's block
// manager has it: a fixed pool of `num_blocks` pages handed out one at a
// time as sequences grow and returned when they finish. serve-sim uses it to
// build slot mappings and block tables; tests/test_block_allocator.cpp checks
// that it never leaks a page or hands one out twice.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace metrale::cli {

class BlockAllocator {
 public:
  // Throws metrale::InvalidArgument when num_blocks < 0.
  explicit BlockAllocator(int32_t num_blocks);

  // A free page id in [0, total()), or nullopt when every page is in use.
  std::optional<int32_t> allocate();

  // Returns `block` to the pool. Throws metrale::InvalidArgument when it is
  // not a page of this pool or is not in use (a double free): in an engine
  // either is a bookkeeping bug that would later let two sequences share a
  // page, so it must fail loudly, not be ignored.
  void free(int32_t block);

  int32_t total() const { return int32_t(in_use_.size()); }
  int32_t num_free() const { return int32_t(free_list_.size()); }
  int32_t num_used() const { return total() - num_free(); }
  bool is_used(int32_t block) const { return block >= 0 && block < total() && in_use_[size_t(block)]; }

 private:
  // LIFO free list: a just-freed page is reused first (warm in cache, as in
  // vLLM's block pool); in_use_ makes free() checks O(1).
  std::vector<int32_t> free_list_;
  std::vector<uint8_t> in_use_;
};

}  // namespace metrale::cli
