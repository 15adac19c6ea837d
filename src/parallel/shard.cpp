// Context-parallel decode, transport-free part (docs/context_parallel.md):
// page ownership, per-rank shards (block tables, lengths, window trimming,
// the window's edge slice), the record layout, and the CPU backend's rank
// states (split-K + edge pass) and merge (permute + reduce).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "host/validate.hpp"
#include "metrale/context_parallel.hpp"
#include "metrale/cpu.hpp"
#include "metrale/error.hpp"
#include "metrale/format.hpp"
#include "metrale/softmax_state.hpp"

namespace metrale::cp {

namespace {
void validate_spec(const ShardSpec& spec) {
  METRALE_CHECK_ARG(spec.num_ranks >= 1, "spec.num_ranks", spec.num_ranks, ">= 1");
  METRALE_CHECK_ARG(spec.chunk_pages >= 0, "spec.chunk_pages", spec.chunk_pages, ">= 0 (0 = default)");
  METRALE_CHECK_ARG(spec.kind == Sharding::contiguous || spec.kind == Sharding::interleaved, "spec.kind",
                    int(spec.kind), "contiguous (0) or interleaved (1)");
}
// What every rank's shard is made from: the spec, the rank, the global tables.
void validate_shard_inputs(const ShardSpec& spec, int32_t rank, const int32_t* block_tables, int32_t max_blocks_per_seq,
                           const int32_t* seq_lens, int32_t num_seqs, int32_t block_size) {
  validate_spec(spec);
  METRALE_CHECK_ARG(rank >= 0 && rank < spec.num_ranks, "rank", rank,
                    "in [0, num_ranks = " + std::to_string(spec.num_ranks) + ")");
  METRALE_CHECK_ARG(num_seqs >= 0, "num_seqs", num_seqs, ">= 0");
  METRALE_CHECK_ARG(block_size >= 1, "block_size", block_size, ">= 1");
  METRALE_CHECK_ARG(max_blocks_per_seq >= 0, "max_blocks_per_seq", max_blocks_per_seq, ">= 0");
  METRALE_CHECK_ARG(num_seqs == 0 || (block_tables && seq_lens), "block_tables/seq_lens", "null",
                    "host arrays when num_seqs > 0");
}
}  // namespace

int32_t owner_of_page(const ShardSpec& spec, int32_t page, int32_t num_pages) {
  validate_spec(spec);
  METRALE_CHECK_ARG(page >= 0 && page < num_pages, "page", page, "in [0, num_pages = " + std::to_string(num_pages) + ")");
  const int32_t R = spec.num_ranks;
  if (spec.kind == Sharding::contiguous) {
    const int32_t chunk = spec.chunk_pages > 0 ? spec.chunk_pages : (num_pages + R - 1) / R;
    return std::min(page / chunk, R - 1);
  }
  const int32_t chunk = spec.chunk_pages > 0 ? spec.chunk_pages : 1;
  return (page / chunk) % R;
}

RankShard make_rank_shard(const ShardSpec& spec, int32_t rank, const int32_t* block_tables,
                          int32_t max_blocks_per_seq, const int32_t* seq_lens, int32_t num_seqs, int32_t block_size,
                          int32_t sliding_window) {
  validate_shard_inputs(spec, rank, block_tables, max_blocks_per_seq, seq_lens, num_seqs, block_size);
  METRALE_CHECK_ARG(sliding_window >= 0, "sliding_window", sliding_window, ">= 0 (0 = off)");
  const int32_t B = block_size;
  RankShard s;
  s.rank = rank;
  s.num_seqs = num_seqs;
  s.has_edge = sliding_window > 0;
  s.seq_lens.assign(size_t(num_seqs), 0);
  s.edges.assign(size_t(num_seqs), EdgeSlice{});
  std::vector<std::vector<int32_t>> rows(static_cast<size_t>(num_seqs));
  for (int32_t i = 0; i < num_seqs; ++i) {
    const int32_t L = seq_lens[i];
    METRALE_CHECK_ARG(L >= 0 && int64_t(L) <= int64_t(max_blocks_per_seq) * B, "seq_lens[i]", L,
                      "in [0, max_blocks_per_seq * block_size] (sequence " + std::to_string(i) + ")");
    if (L == 0) continue;
    const int32_t n = (L + B - 1) / B;
    const int32_t ws = window_start(L, sliding_window);
    const int32_t head = ws / B, off = ws % B;
    const int32_t* row = block_tables + int64_t(i) * max_blocks_per_seq;
    if (off > 0 && owner_of_page(spec, head, n) == rank) {
      s.edges[size_t(i)] = EdgeSlice{row[head], off, std::min(B, L - head * B)};
      s.attended_tokens += s.edges[size_t(i)].end - off;
    }
    int32_t len = 0;
    for (int32_t p = head + (off > 0 ? 1 : 0); p < n; ++p) {
      if (owner_of_page(spec, p, n) != rank) continue;
      rows[size_t(i)].push_back(p);
      len += std::min(B, L - p * B);  // only the global last page can be partial: it is the last we add
    }
    s.seq_lens[size_t(i)] = len;
    s.attended_tokens += len;
    s.max_blocks_per_seq = std::max(s.max_blocks_per_seq, int32_t(rows[size_t(i)].size()));
  }
  const size_t mb = size_t(s.max_blocks_per_seq);
  s.block_tables.assign(size_t(num_seqs) * mb, -1);
  s.global_page.assign(size_t(num_seqs) * mb, -1);
  for (int32_t i = 0; i < num_seqs; ++i) {
    const int32_t* row = block_tables + int64_t(i) * max_blocks_per_seq;
    for (size_t j = 0; j < rows[size_t(i)].size(); ++j) {
      s.global_page[size_t(i) * mb + j] = rows[size_t(i)][j];
      s.block_tables[size_t(i) * mb + j] = row[rows[size_t(i)][j]];
    }
  }
  return s;
}

std::vector<RankShard> make_shards(const ShardSpec& spec, const int32_t* block_tables, int32_t max_blocks_per_seq,
                                   const int32_t* seq_lens, int32_t num_seqs, int32_t block_size,
                                   int32_t sliding_window) {
  validate_spec(spec);
  std::vector<RankShard> out;
  out.reserve(size_t(spec.num_ranks));
  for (int32_t r = 0; r < spec.num_ranks; ++r)
    out.push_back(make_rank_shard(spec, r, block_tables, max_blocks_per_seq, seq_lens, num_seqs, block_size,
                                  sliding_window));
  return out;
}

AttnArgs rank_attn_args(const AttnArgs& global, const RankShard& shard, const int32_t* block_tables,
                            const int32_t* seq_lens) {
  METRALE_CHECK_ARG(shard.num_seqs == global.num_seqs, "shard.num_seqs", shard.num_seqs,
                    "the batch's num_seqs = " + std::to_string(global.num_seqs));
  AttnArgs a = global;
  a.block_tables = block_tables;
  a.seq_lens = seq_lens;
  a.max_blocks_per_seq = shard.max_blocks_per_seq;
  a.sliding_window = 0;  // applied by the host trimming + edge pass
  return a;
}

void CpLayout::validate() const {
  METRALE_CHECK_ARG(num_ranks >= 1, "num_ranks", num_ranks, ">= 1");
  METRALE_CHECK_ARG(num_seqs >= 0, "num_seqs", num_seqs, ">= 0");
  METRALE_CHECK_ARG(num_q_heads >= 1, "num_q_heads", num_q_heads, ">= 1");
  METRALE_CHECK_ARG(head_dim >= 2 && head_dim % 2 == 0, "head_dim", head_dim, "an even value >= 2");
  METRALE_CHECK_ARG(splits_per_rank >= 1 && splits_per_rank <= kMaxSplits, "splits_per_rank", splits_per_rank,
                    "in [1, " + std::to_string(kMaxSplits) + "]");
  METRALE_CHECK_ARG(merged_splits() <= kMaxSplits, "num_ranks * (splits_per_rank + has_edge)", merged_splits(),
                    "<= kMaxSplits = " + std::to_string(kMaxSplits) + " (the reduce's limit)");
}

RunShard make_run_shard(const ShardSpec& spec, int32_t rank, const int32_t* block_tables, int32_t max_blocks_per_seq,
                        const int32_t* seq_lens, int32_t num_seqs, int32_t block_size) {
  validate_shard_inputs(spec, rank, block_tables, max_blocks_per_seq, seq_lens, num_seqs, block_size);
  if (spec.kind != Sharding::contiguous)
    detail::throw_unsupported("spec.kind", "interleaved", "contiguous sharding for query runs (one range of positions)");
  const int32_t B = block_size;
  RunShard s;
  s.rank = rank;
  s.num_seqs = num_seqs;
  s.kv_start.assign(size_t(num_seqs), 0);
  s.kv_lens.assign(size_t(num_seqs), 0);
  std::vector<std::vector<int32_t>> rows(static_cast<size_t>(num_seqs));
  for (int32_t i = 0; i < num_seqs; ++i) {
    const int32_t L = seq_lens[i];
    METRALE_CHECK_ARG(L >= 0 && int64_t(L) <= int64_t(max_blocks_per_seq) * B, "seq_lens[i]", L,
                      "in [0, max_blocks_per_seq * block_size] (sequence " + std::to_string(i) + ")");
    const int32_t n = (L + B - 1) / B;
    const int32_t* row = block_tables + int64_t(i) * max_blocks_per_seq;
    int32_t first = -1, end = -1;  // the rank's pages: one contiguous range
    for (int32_t p = 0; p < n; ++p)
      if (owner_of_page(spec, p, n) == rank) {
        if (first < 0) first = p;
        end = p + 1;
        rows[size_t(i)].push_back(row[p]);
      }
    if (first < 0) continue;
    s.kv_start[size_t(i)] = first * B;
    s.kv_lens[size_t(i)] = std::min(L, end * B) - first * B;
  }
  for (const auto& r : rows) s.max_blocks_per_seq = std::max<int32_t>(s.max_blocks_per_seq, int32_t(r.size()));
  s.block_tables.assign(size_t(num_seqs) * s.max_blocks_per_seq, -1);
  for (int32_t i = 0; i < num_seqs; ++i)
    std::copy(rows[size_t(i)].begin(), rows[size_t(i)].end(),
              s.block_tables.begin() + int64_t(i) * s.max_blocks_per_seq);
  return s;
}

AttnArgs rank_attn_args(const AttnArgs& global, const RunShard& shard, const int32_t* block_tables,
                             const int32_t* kv_start, const int32_t* kv_lens) {
  METRALE_CHECK_ARG(shard.num_seqs == global.num_seqs, "shard.num_seqs", shard.num_seqs,
                    "the batch's num_seqs = " + std::to_string(global.num_seqs));
  AttnArgs a = global;
  a.block_tables = block_tables;
  a.max_blocks_per_seq = shard.max_blocks_per_seq;
  a.kv_start = kv_start;
  a.kv_lens = kv_lens;
  return a;
}

CpLayout run_layout(int32_t num_ranks, const AttnArgs& args, int32_t splits_per_rank) {
  CpLayout L;
  L.num_ranks = num_ranks;
  L.num_seqs = args.rows();
  L.num_q_heads = args.num_q_heads;
  L.head_dim = args.cache.layout.head_dim;
  L.splits_per_rank = splits_per_rank;
  L.has_edge = false;
  L.validate();
  return L;
}

CpLayout make_layout(int32_t num_ranks, const AttnArgs& args, int32_t splits_per_rank, bool has_edge) {
  CpLayout L = run_layout(num_ranks, args, splits_per_rank);  // decode: a row per sequence
  L.has_edge = has_edge;
  L.validate();
  return L;
}

}  // namespace metrale::cp

namespace metrale::detail {

void validate_cp_rank_args(const cp::CpLayout& L, const AttnArgs& a) {
  L.validate();
  METRALE_CHECK_ARG(a.num_seqs == L.num_seqs && a.num_q_heads == L.num_q_heads && a.cache.layout.head_dim == L.head_dim,
                    "rank_args", "shape", "the layout's num_seqs, num_q_heads and head_dim");
  METRALE_CHECK_ARG(a.sliding_window == 0, "rank_args.sliding_window", a.sliding_window,
                    "0 (the shard already applies the window; use cp::rank_attn_args)");
}

}  // namespace metrale::detail

namespace metrale::cpu {

namespace {
// Dequantized element d of token t, kv head h of cache page `page` (docs/spec.md 2, 3).
float cache_elem(const KvCacheView& c, bool is_k, int32_t page, int32_t t, int32_t h, int32_t d) {
  const KvCacheLayout& L = c.layout;
  const KvFormatDesc& f = kv_format_desc(L.format);
  const uint8_t* base = static_cast<const uint8_t*>(is_k ? c.k : c.v) + int64_t(page) * L.page_stride_bytes;
  const int64_t row = int64_t(t) * L.num_kv_heads + h;
  return f.element(base + f.code_offset(L, row), base + f.scale_offset(L, row), d,
                   is_k ? f.k_scale(c.scales) : f.v_scale(c.scales));
}

void check_rank_args(const AttnArgs& a, const void* edges, const float* records) {
  METRALE_CHECK_ARG(a.num_seqs >= 0, "num_seqs", a.num_seqs, ">= 0");
  if (a.num_seqs == 0) return;
  METRALE_CHECK_ARG(a.q && a.cache.k && a.cache.v, "q/cache", "null", "non-null pointers");
  METRALE_CHECK_ARG(edges != nullptr, "edges", "null", "an array of num_seqs EdgeSlice");
  METRALE_CHECK_ARG(records != nullptr, "edge_records", "null", "num_seqs * num_q_heads records");
  METRALE_CHECK_ARG(a.num_q_heads >= 1 && a.cache.layout.num_kv_heads >= 1 &&
                        a.num_q_heads % a.cache.layout.num_kv_heads == 0,
                    "num_q_heads", a.num_q_heads, "a multiple of num_kv_heads");
}
}  // namespace

void cp_edge_states(const AttnArgs& a, const cp::EdgeSlice* edges, float* rec) {
  check_rank_args(a, edges, rec);
  const int32_t D = a.cache.layout.head_dim, H = a.num_q_heads;
  const int32_t group = H / a.cache.layout.num_kv_heads;
  std::vector<float> s, q(size_t(D), 0.0f);
  for (int32_t i = 0; i < a.num_seqs; ++i) {
    const cp::EdgeSlice e = edges[i];
    for (int32_t h = 0; h < H; ++h) {
      float* r = rec + (int64_t(i) * H + h) * softmax::record_floats(D);
      if (e.page < 0 || e.end <= e.begin) {
        std::fill(r, r + D, 0.0f);
        softmax::store_state(r, D, softmax::State<>::empty());
        continue;
      }
      METRALE_CHECK_ARG(e.page < a.cache.layout.num_blocks && e.begin >= 0 && e.end <= a.cache.layout.block_size,
                        "edges[i].page", e.page, "a page of the cache and 0 <= begin < end <= block_size");
      const int32_t kvh = h / group;
      for (int32_t d = 0; d < D; ++d) q[size_t(d)] = codec::bf16_to_float(a.q[int64_t(i) * a.q_stride + int64_t(h) * a.q_head_stride_used() + d]);
      s.assign(size_t(e.end - e.begin), 0.0f);
      float m = softmax::State<>::empty().m;
      for (int32_t t = e.begin; t < e.end; ++t) {
        float acc = 0.0f;
        for (int32_t d = 0; d < D; ++d) acc += q[size_t(d)] * cache_elem(a.cache, true, e.page, t, kvh, d);
        s[size_t(t - e.begin)] = acc * a.sm_scale;
        m = std::max(m, s[size_t(t - e.begin)]);  // a NaN logit reaches l below
      }
      float l = 0.0f;
      for (float& x : s) {
        x = std::exp(x - m);
        l += x;
      }
      for (int32_t d = 0; d < D; ++d) {
        float acc = 0.0f;
        for (int32_t t = e.begin; t < e.end; ++t) acc += s[size_t(t - e.begin)] * cache_elem(a.cache, false, e.page, t, kvh, d);
        r[d] = acc / l;
      }
      softmax::store_state(r, D, {m, l});
    }
  }
}

void cp_rank_states(const cp::CpLayout& L, const AttnArgs& a, const cp::EdgeSlice* edges, float* block) {
  detail::validate_cp_rank_args(L, a);
  if (L.num_seqs == 0) return;
  const SplitKWorkspace ws = cp::rank_splitk_workspace(L, block);
  AttnPlanOptions o;  // the rank's split-K states, merged by cp_merge
  o.num_splits = ws.num_splits;
  o.merge = SplitMerge::states_only;
  run_attention(plan_attention(attention_problem(a), attention_target(), o), a, ws);
  if (L.has_edge) cp_edge_states(a, edges, block + L.splitk_floats());
}

void cp_merge(const cp::CpLayout& L, const float* gathered, float* merged, bf16* out) {
  L.validate();
  if (L.num_seqs == 0) return;
  METRALE_CHECK_ARG(gathered && merged && out, "gathered/merged/out", "null", "non-null host buffers");
  const size_t rec = L.record_floats(), rows = size_t(L.num_seqs) * L.num_q_heads;
  const size_t k = size_t(L.slots()), ns = size_t(L.splits_per_rank), R = size_t(L.num_ranks);
  for (size_t r = 0; r < R; ++r) {
    const float* blk = gathered + r * L.rank_floats();
    for (size_t row = 0; row < rows; ++row) {
      float* dst = merged + (row * R + r) * k * rec;
      std::memcpy(dst, blk + row * ns * rec, ns * rec * sizeof(float));
      if (L.has_edge) std::memcpy(dst + ns * rec, blk + L.splitk_floats() + row * rec, rec * sizeof(float));
    }
  }
  ReduceArgs ra{merged, L.merged_floats() * sizeof(float), L.num_seqs, L.num_q_heads, L.head_dim,
                L.merged_splits(), out};
  reduce_states(ra);
}

}  // namespace metrale::cpu
