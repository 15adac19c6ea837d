// The page allocator (see block_allocator.hpp).
#include "block_allocator.hpp"

#include "metrale/error.hpp"

namespace metrale::cli {

BlockAllocator::BlockAllocator(int32_t num_blocks) {
  METRALE_CHECK_ARG(num_blocks >= 0, "num_blocks", num_blocks, ">= 0");
  in_use_.assign(size_t(num_blocks), 0);
  free_list_.reserve(size_t(num_blocks));
  // Pushed in reverse so that the first allocations come out as 0, 1, 2, ...
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_list_.push_back(b);
}

std::optional<int32_t> BlockAllocator::allocate() {
  if (free_list_.empty()) return std::nullopt;
  const int32_t b = free_list_.back();
  free_list_.pop_back();
  in_use_[size_t(b)] = 1;
  return b;
}

void BlockAllocator::free(int32_t block) {
  METRALE_CHECK_ARG(block >= 0 && block < total(), "block", block, "a page id in [0, " + std::to_string(total()) + ")");
  METRALE_CHECK_ARG(in_use_[size_t(block)] != 0, "block", block, "a page in use (this one is already free)");
  in_use_[size_t(block)] = 0;
  free_list_.push_back(block);
}

}  // namespace metrale::cli
