// Random decode problems on the host, shared by the CPU and GPU tests.
//
// make_problem builds everything a decode call needs: bf16 K/V rows written
// into paged caches (by cpu::reshape_and_cache) placed on randomly permuted
// pages, block tables whose unused entries hold INVALID page ids (so a kernel
// that reads outside the attended range is caught), q rows with a stride,
// and the scales. GPU tests upload k_cache / v_cache / q / block_tables /
// seq_lens, build their AttnArgs with device_args(), run the kernel and
// check the download with compare_decode(out, reference_attention(p), ...).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "metrale/cache.hpp"
#include "metrale/codec.hpp"
#include "metrale/ops.hpp"
#include "testing/reference.hpp"

namespace metrale::test {

struct DecodeCase {
  KvFormat format = KvFormat::bf16;
  int32_t head_dim = 128, block_size = 16, num_kv_heads = 2, group = 4;  // num_q_heads = group * num_kv_heads
  std::vector<int32_t> seq_lens;
  int32_t sliding_window = 0;
  int64_t q_stride_pad = 0;    // extra elements per q row, multiple of 8
  // q head-major: head h of row r at h*q_head_stride + r*q_stride (q_stride =
  // head_dim + q_stride_pad, q_head_stride = rows*q_stride + 8), as
  // transformers' (batch 1, heads, tokens, head_dim) query viewed as
  // (tokens, heads, head_dim); else rows of packed heads.
  bool q_head_major = false;
  int64_t kv_row_pad = 0;      // extra elements per key/value input row, multiple of 8
  int64_t page_pad_bytes = 0;  // extra bytes per page, multiple of 16 (all formats: page_stride_bytes grows;
                               // nvfp4 also gets a 16-byte gap between data and scale sections when nonzero)
  int32_t extra_blocks = 3;    // pages of the cache no sequence uses
  bool outlier_channels = true;  // a few large-magnitude channels per kv head in K
  // nvfp4 per-tensor second scales; <= 0 calibrates from the data's absmax
  // (nvfp4_global_scale_from_absmax).
  float k_global_scale = 1.0f, v_global_scale = 1.0f;

  int32_t num_q_heads() const { return num_kv_heads * group; }
  std::string describe() const;
};

struct HostProblem {
  DecodeCase c;
  KvCacheLayout layout;
  KvScales scales;
  std::vector<uint8_t> k_cache, v_cache;  // layout.cache_bytes() each; unwritten bytes are random garbage
  std::vector<bf16> key, value;           // the bf16 rows that were written, [num_tokens, kv_row_stride]
  int64_t kv_row_stride = 0;              // elements: num_kv_heads*head_dim + kv_row_pad
  std::vector<int64_t> slot_mapping;      // [num_tokens], shuffled; includes two padding tokens (slot < 0)
  std::vector<bf16> q;                    // [num_seqs, q_stride] or head-major (DecodeCase::q_head_major)
  int64_t q_stride = 0, q_head_stride = 0;
  std::vector<int32_t> block_tables;      // [num_seqs, max_blocks_per_seq]
  int32_t max_blocks_per_seq = 0;
  std::vector<int32_t> seq_lens;
  float sm_scale = 0.0f;

  int32_t num_seqs() const { return int32_t(seq_lens.size()); }
  int32_t num_q_heads() const { return c.num_q_heads(); }
  int64_t num_tokens() const { return int64_t(slot_mapping.size()); }
  size_t out_elems() const { return size_t(num_seqs()) * num_q_heads() * layout.head_dim; }

  // Host pointers into this object's vectors.
  KvCacheView cache_view() const;
  AttnArgs args(bf16* out) const;
  CacheWriteArgs write_args() const;

  // The same arguments on other memory (device copies of the vectors above).
  AttnArgs device_args(const bf16* q, void* k_cache, void* v_cache, const int32_t* block_tables,
                         const int32_t* seq_lens, bf16* out) const;
  CacheWriteArgs device_write_args(const bf16* key, const bf16* value, const int64_t* slot_mapping,
                                   void* k_cache, void* v_cache, int32_t* skipped = nullptr) const;
};

HostProblem make_problem(const DecodeCase& c, uint64_t seed);

// The strides and size of `rows` q rows of c's heads (c.q_stride_pad, c.q_head_major).
struct QLayout {
  int64_t row_stride = 0, head_stride = 0;
  size_t elems = 0;
};
inline QLayout q_layout(const DecodeCase& c, int64_t rows) {
  const int64_t D = c.head_dim, Hq = c.num_q_heads();
  QLayout l;
  if (c.q_head_major) {
    l.row_stride = D + c.q_stride_pad;
    l.head_stride = rows * l.row_stride + 8;
    l.elems = size_t(Hq * l.head_stride);
  } else {
    l.row_stride = Hq * D + c.q_stride_pad;
    l.head_stride = D;
    l.elems = size_t(rows * l.row_stride);
  }
  return l;
}

// The float64 reference (testing/reference.hpp) over p's cache: what every
// decode of p must match (compare_decode).
std::vector<double> reference_attention(const HostProblem& p);

// Writes a NaN into the cache element (seq, pos, kv head h, d) of K
// (`which` 'k') or V ('v'); for nvfp4 into the scale of d's group (E2M1
// codes have no NaN).
void poison_cache(HostProblem& p, char which, int32_t seq, int32_t pos, int32_t h, int32_t d);

// One of `options`, drawn uniformly: the shape matrices of the randomized tests.
template <class... V>
int64_t pick(std::mt19937_64& rng, V... options) {
  const int64_t opts[] = {int64_t(options)...};
  return opts[rng() % sizeof...(options)];
}

// A seed from std::random_device; tests print it with SCOPED_TRACE so that a
// failure can be replayed.
uint64_t random_seed();

// bf16 output buffers are poisoned with this pattern (a NaN) before a call,
// so an element the kernel did not write is caught.
constexpr uint16_t kPoisonBf16 = 0xFFFF;
std::vector<bf16> poisoned_bf16(size_t n);
// Elements still holding the poison pattern.
int64_t count_poison(const bf16* x, size_t n);

// `n` lengths in [0, max_len] that exercise page boundaries, shuffled: 0 and
// 1 (when n >= 4), k*block_size and k*block_size +- 1, and random ones.
std::vector<int32_t> interesting_lengths(int32_t block_size, int32_t max_len, int32_t n, uint64_t seed);

}  // namespace metrale::test
