// The reference-counted page allocator (metrale/block_allocator.hpp).
#include "metrale/block_allocator.hpp"

#include <string>

#include "metrale/error.hpp"

namespace metrale {

BlockAllocator::BlockAllocator(int32_t num_blocks) {
  METRALE_CHECK_ARG(num_blocks >= 0, "num_blocks", num_blocks, ">= 0");
  refs_.assign(size_t(num_blocks), 0);
  free_list_.reserve(size_t(num_blocks));
  // Pushed in reverse so that the first allocations come out as 0, 1, 2, ...
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_list_.push_back(b);
}

void BlockAllocator::check_used(int32_t block, const char* what) const {
  METRALE_CHECK_ARG(block >= 0 && block < total(), "block", block, "a page id in [0, " + std::to_string(total()) + ")");
  METRALE_CHECK_ARG(refs_[size_t(block)] > 0, "block", block,
                    std::string("a page in use (this one is free) to ") + what);
}

std::optional<int32_t> BlockAllocator::allocate() {
  if (free_list_.empty()) return std::nullopt;
  const int32_t b = free_list_.back();
  free_list_.pop_back();
  refs_[size_t(b)] = 1;
  return b;
}

void BlockAllocator::share(int32_t block) {
  check_used(block, "share");
  ++refs_[size_t(block)];
}

bool BlockAllocator::free(int32_t block) {
  check_used(block, "free");
  if (--refs_[size_t(block)] > 0) return false;
  free_list_.push_back(block);
  return true;
}

std::optional<int32_t> BlockAllocator::writable(int32_t block) {
  check_used(block, "write");
  if (refs_[size_t(block)] == 1) return block;
  const std::optional<int32_t> fresh = allocate();
  if (fresh) --refs_[size_t(block)];
  return fresh;
}

}  // namespace metrale
