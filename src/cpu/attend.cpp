// The CPU decode core (see attend.hpp).
#include "cpu/attend.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu/kv_rows.hpp"

namespace metrale::cpu::detail {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Dot product with 8 independent lanes (vectorizes without -ffast-math).
inline float dot(const float* __restrict a, const float* __restrict b, int32_t n) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int32_t d = 0; d < n; d += 8)
    for (int j = 0; j < 8; ++j) s[j] += a[d + j] * b[d + j];
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

inline void axpy(float p, const float* __restrict x, float* __restrict y, int32_t n) {
  for (int32_t d = 0; d < n; ++d) y[d] += p * x[d];
}

}  // namespace

DecodeContext::DecodeContext(const AttnArgs& args)
    : a(args),
      num_kv_heads(args.cache.layout.num_kv_heads),
      head_dim(args.cache.layout.head_dim),
      block_size(args.cache.layout.block_size),
      group(args.num_q_heads / args.cache.layout.num_kv_heads),
      k_logit_scale(args.sm_scale * kv_format_desc(args.cache.layout.format).k_scale(args.cache.scales)),
      v_out_scale(kv_format_desc(args.cache.layout.format).v_scale(args.cache.scales)) {}

int32_t DecodeContext::seq_len(int32_t seq) const {
  if (a.kv_start != nullptr) return std::max(a.seq_lens[seq], 0);  // the view's length is kv_lens (validated)
  return int32_t(std::min<int64_t>(std::max(a.seq_lens[seq], 0), int64_t(a.max_blocks_per_seq) * block_size));
}

int32_t DecodeContext::run_len(int32_t seq) const {
  if (a.q_start == nullptr) return 1;
  return std::clamp(a.q_start[seq + 1] - a.q_start[seq], 0, seq_len(seq));
}

// Positions of sequence `seq` (the shard's own with a view) and their pages.
DecodeContext::SeqRange DecodeContext::in_view(int32_t seq, QueryRange r) const {
  if (a.kv_start != nullptr) r = view_range(r, a.kv_start[seq], a.kv_lens[seq]);
  const int32_t pos_end = std::max(r.end, 0);
  const int32_t pos_begin = std::min(r.begin, pos_end);
  return SeqRange{PageRange{pos_begin / block_size, (pos_end + block_size - 1) / block_size}, pos_begin, pos_end};
}

DecodeContext::SeqRange DecodeContext::query(int32_t seq, int32_t j) const {
  return in_view(seq, query_range(seq_len(seq), std::max(run_len(seq), 1), j, a.sliding_window));
}

PageRange DecodeContext::run_pages(int32_t seq) const {
  // Ranges grow with the row: from the first row's start to the last row's
  // end (in a shard view that span clipped to it, not the clipped rows'
  // ends: a window can leave the last rows nothing while earlier rows
  // attend the view's end).
  const int32_t len = seq_len(seq), n = std::max(run_len(seq), 1);
  return in_view(seq, QueryRange{query_range(len, n, 0, a.sliding_window).begin,
                                 query_range(len, n, n - 1, a.sliding_window).end})
      .pages;
}

void GroupState::reset(int32_t group, int32_t head_dim, int32_t block_size) {
  q.assign(size_t(group) * head_dim, 0.0f);
  acc.assign(size_t(group) * head_dim, 0.0f);
  m.assign(group, kNegInf);
  l.assign(group, 0.0f);
  nan.assign(group, 0);
  k.resize(head_dim);
  v.resize(head_dim);
  p.resize(size_t(group) * block_size);
}

void load_group(const DecodeContext& c, int32_t row, int32_t kv_head, GroupState& st) {
  st.reset(c.group, c.head_dim, c.block_size);
  st.softcap = c.a.softcap;
  const int64_t head_stride = c.a.q_head_stride_used();
  for (int32_t g = 0; g < c.group; ++g) {
    const bf16* q = c.a.q + int64_t(row) * c.a.q_stride + int64_t(kv_head * c.group + g) * head_stride;
    for (int32_t d = 0; d < c.head_dim; ++d)
      st.q[size_t(g) * c.head_dim + d] = codec::bf16_to_float(q[d]) * c.k_logit_scale;
  }
}

bool pages_valid(const DecodeContext& c, int32_t seq, PageRange pages) {
  const int32_t* row = c.a.block_tables + int64_t(seq) * c.a.max_blocks_per_seq;
  for (int32_t pg = pages.first; pg < pages.end; ++pg)
    if (row[pg] < 0 || row[pg] >= c.a.cache.layout.num_blocks) return false;
  return true;
}

void attend_pages(const DecodeContext& c, int32_t seq, int32_t kv_head, PageRange pages, int32_t pos_begin,
                  int32_t pos_end, GroupState& st) {
  const KvCacheLayout& layout = c.a.cache.layout;
  const KvFormatDesc& fmt = kv_format_desc(layout.format);
  const CodecTables& tab = CodecTables::get();
  const int32_t* row = c.a.block_tables + int64_t(seq) * c.a.max_blocks_per_seq;
  const int32_t G = c.group, D = c.head_dim, B = c.block_size, H = c.num_kv_heads;

  for (int32_t pg = pages.first; pg < pages.end; ++pg) {
    const int64_t base = int64_t(pg) * B;  // int64: (pg + 2) * B may pass INT32_MAX
    const int32_t t0 = int32_t(std::max<int64_t>(base, pos_begin) - base);      // masked: before the window
    const int32_t t1 = int32_t(std::min<int64_t>(base + B, pos_end) - base);    // masked: past the length
    if (t1 <= t0) continue;
    const int32_t nt = t1 - t0;
    const uint8_t* kpage = page_ptr(c.a.cache.k, layout, row[pg]);
    const uint8_t* vpage = page_ptr(c.a.cache.v, layout, row[pg]);
    if (pg + 1 < pages.end) {  // fetch the next page's rows of this head while this one computes
      const int32_t n1 = int32_t(std::min<int64_t>(base + 2 * B, pos_end) - (base + B));
      prefetch_rows(fmt, page_ptr(c.a.cache.k, layout, row[pg + 1]), layout, 0, n1, kv_head);
      prefetch_rows(fmt, page_ptr(c.a.cache.v, layout, row[pg + 1]), layout, 0, n1, kv_head);
    }

    // Logits of the page: one dequantized K row serves every q head of the group.
    for (int32_t t = t0; t < t1; ++t) {
      dequant_row(fmt, kpage, layout, int64_t(t) * H + kv_head, tab, st.k.data());
      for (int32_t g = 0; g < G; ++g) st.p[size_t(g) * B + (t - t0)] = dot(&st.q[size_t(g) * D], st.k.data(), D);
    }
    if (st.softcap > 0.0f)
      for (int32_t g = 0; g < G; ++g)
        for (int32_t i = 0; i < nt; ++i) {
          float& x = st.p[size_t(g) * B + i];
          x = st.softcap * std::tanh(x / st.softcap);
        }
    // Online softmax, rescaling once per page. max() would drop a NaN logit,
    // so NaN is tracked explicitly and poisons the head's result.
    for (int32_t g = 0; g < G; ++g) {
      float* p = &st.p[size_t(g) * B];
      float page_max = kNegInf;
      bool nan = false;
      for (int32_t i = 0; i < nt; ++i) {
        nan |= std::isnan(p[i]);
        page_max = p[i] > page_max ? p[i] : page_max;
      }
      st.nan[g] |= uint8_t(nan);
      const float m_new = std::max(st.m[g], page_max);
      if (m_new == kNegInf) {  // every logit so far is -inf (or NaN): nothing to add
        for (int32_t i = 0; i < nt; ++i) p[i] = 0.0f;
        continue;
      }
      if (m_new != st.m[g]) {
        const float alpha = std::exp(st.m[g] - m_new);  // exp(-inf) = 0 on the first page
        st.l[g] *= alpha;
        for (int32_t d = 0; d < D; ++d) st.acc[size_t(g) * D + d] *= alpha;
        st.m[g] = m_new;
      }
      float sum = 0.0f;
      for (int32_t i = 0; i < nt; ++i) {
        p[i] = std::exp(p[i] - m_new);
        sum += p[i];
      }
      st.l[g] += sum;
    }
    // p * V: a NaN in V reaches the output through the multiply (0 * NaN = NaN).
    for (int32_t t = t0; t < t1; ++t) {
      dequant_row(fmt, vpage, layout, int64_t(t) * H + kv_head, tab, st.v.data());
      for (int32_t g = 0; g < G; ++g) axpy(st.p[size_t(g) * B + (t - t0)], st.v.data(), &st.acc[size_t(g) * D], D);
    }
  }
}

}  // namespace metrale::cpu::detail
