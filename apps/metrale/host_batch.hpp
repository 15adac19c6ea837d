// The demo's decode batch on the host: random bf16 K/V rows of a batch of
// mixed-length sequences (a few large-magnitude K channels, as real models
// have), their paged placement (shuffled pages, block tables, slot mapping)
// and one bf16 query row per sequence. Every backend quantizes and decodes
// these same rows, so their outputs compare against one float64 reference.
// Also the per-format cache setup the jobs share (layout, calibrated scales).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <new>
#include <vector>

#include "metrale/cache.hpp"
#include "metrale/codec.hpp"
#include "metrale/format.hpp"
#include "metrale/ops.hpp"
#include "metrale/plan.hpp"
#include "testing/reference.hpp"

namespace metrale::cli {

// 64-byte aligned storage: the library wants 16-byte aligned pointers.
template <class T>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <class U>
  AlignedAllocator(const AlignedAllocator<U>&) {}
  T* allocate(size_t n) {
    const size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
    if (void* p = std::aligned_alloc(64, bytes ? bytes : 64)) return static_cast<T*>(p);
    throw std::bad_alloc();
  }
  void deallocate(T* p, size_t) { std::free(p); }
  template <class U>
  bool operator==(const AlignedAllocator<U>&) const { return true; }
  template <class U>
  bool operator!=(const AlignedAllocator<U>&) const { return false; }
};
template <class T>
using AlignedVector = std::vector<T, AlignedAllocator<T>>;

// One attention layer's shape (default: Qwen3-8B).
struct LayerShape {
  int32_t num_q_heads = 32;
  int32_t num_kv_heads = 8;
  int32_t head_dim = 128;
  int32_t block_size = 16;
  int32_t num_layers = 36;  // of the model, for whole-model capacity figures only
};

struct HostBatch {
  LayerShape shape;
  std::vector<int32_t> seq_lens;
  std::vector<int64_t> first_token;   // [num_seqs]: row of each sequence's position 0 in key/value
  int64_t num_blocks = 0;             // pages of the cache (exactly the pages the batch uses)
  int32_t max_blocks_per_seq = 0;
  std::vector<int32_t> block_tables;  // [num_seqs, max_blocks_per_seq], pages shuffled over the cache
  std::vector<int64_t> slot_mapping;  // [num_tokens]
  AlignedVector<bf16> key, value;     // [num_tokens, kv_row()]
  AlignedVector<bf16> q;              // [num_seqs, q_row()]
  float sm_scale = 0.0f;

  int32_t num_seqs() const { return int32_t(seq_lens.size()); }
  int64_t num_tokens() const { return int64_t(slot_mapping.size()); }
  int64_t kv_row() const { return int64_t(shape.num_kv_heads) * shape.head_dim; }
  int64_t q_row() const { return int64_t(shape.num_q_heads) * shape.head_dim; }
  int64_t out_elems() const { return int64_t(num_seqs()) * q_row(); }
  int32_t max_seq_len() const;

  // The batch's calls, over copies of its arrays on either backend's memory.
  CacheWriteArgs write_args(const bf16* key_rows, const bf16* value_rows, const int64_t* slots,
                            const KvCacheView& cache) const;
  AttnArgs decode_args(const bf16* q_rows, const KvCacheView& cache, const int32_t* tables, const int32_t* lens,
                         bf16* out) const;
};

// `num_seqs` sequences: the first has `max_len` tokens, the others random
// lengths in [max_len/8, max_len]. Deterministic for a seed.
HostBatch make_batch(const LayerShape& shape, int32_t num_seqs, int32_t max_len, uint64_t seed);

// The batch's bf16 rows as written (before quantization), for the float64
// reference (testing/reference.hpp): what each format costs in accuracy.
test::KvRows bf16_rows(const HostBatch& batch);

// Every format of the table (metrale/format.hpp), in its order.
inline std::vector<KvFormat> all_formats() {
  std::vector<KvFormat> f;
  for (const KvFormatDesc& d : kKvFormats) f.push_back(d.format);
  return f;
}

// Dense layout of `format` with `num_blocks` pages.
KvCacheLayout make_layout(KvFormat format, const LayerShape& shape, int64_t num_blocks);


// The scales calibrated on the batch's own K and V rows (absmax is exact, so
// computing it on the host gives what either backend's absmax gives).
KvScales calibrated_scales(const HostBatch& batch, KvFormat format);


}  // namespace metrale::cli
