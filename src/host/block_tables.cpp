// The debug validator of block tables and lengths (docs/spec.md 6), on host copies.
#include <string>

#include "metrale/error.hpp"
#include "metrale/plan.hpp"

namespace metrale {

void validate_block_tables(const KvCacheLayout& layout, const int32_t* block_tables, int32_t max_blocks_per_seq,
                           const int32_t* seq_lens, int32_t num_seqs, int32_t sliding_window) {
  layout.validate();
  METRALE_CHECK_ARG(max_blocks_per_seq > 0, "max_blocks_per_seq", max_blocks_per_seq, "> 0");
  if (num_seqs <= 0) return;
  METRALE_CHECK_ARG(block_tables != nullptr, "block_tables", "nullptr", "a host pointer");
  METRALE_CHECK_ARG(seq_lens != nullptr, "seq_lens", "nullptr", "a host pointer");
  const int64_t max_len = int64_t(max_blocks_per_seq) * layout.block_size;
  for (int32_t s = 0; s < num_seqs; ++s) {
    const int32_t len = seq_lens[s];
    if (len < 0 || len > max_len)
      detail::throw_invalid("seq_lens", "seq_lens[" + std::to_string(s) + "] = " + std::to_string(len),
                            "0..max_blocks_per_seq*block_size = " + std::to_string(max_len));
    const PageRange r = attended_pages(len, sliding_window, layout.block_size);
    for (int32_t pg = r.first; pg < r.end; ++pg) {
      const int32_t id = block_tables[int64_t(s) * max_blocks_per_seq + pg];
      if (id < 0 || id >= layout.num_blocks)
        detail::throw_invalid("block_tables",
                              "block_tables[" + std::to_string(s) + "][" + std::to_string(pg) + "] = " +
                                  std::to_string(id),
                              "a page id in 0.." + std::to_string(layout.num_blocks - 1));
    }
  }
}

}  // namespace metrale
