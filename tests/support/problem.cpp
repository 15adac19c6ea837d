// Random host decode problems (see problem.hpp).
#include "support/problem.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>

#include "metrale/cpu.hpp"

namespace metrale::test {
namespace {

bf16 to_bf16(float x) { return codec::float_to_bf16(x); }
constexpr bf16 kNaNBf16{0x7fc0};

// Per-tensor absmax of the written rows (own loop: independent of cpu::bf16_absmax).
float rows_absmax(const std::vector<bf16>& rows, int64_t stride, int64_t row_len, const std::vector<int64_t>& slots) {
  float m = 0.0f;
  for (size_t j = 0; j < slots.size(); ++j) {
    if (slots[j] < 0) continue;
    for (int64_t i = 0; i < row_len; ++i) m = std::max(m, std::fabs(codec::bf16_to_float(rows[j * stride + i])));
  }
  return m;
}

}  // namespace

std::string DecodeCase::describe() const {
  std::ostringstream os;
  os << "format=" << to_string(format) << " head_dim=" << head_dim << " block_size=" << block_size
     << " kv_heads=" << num_kv_heads << " group=" << group << " window=" << sliding_window
     << " q_pad=" << q_stride_pad << (q_head_major ? " q_head_major" : "") << " kv_row_pad=" << kv_row_pad << " page_pad=" << page_pad_bytes
     << " extra_blocks=" << extra_blocks << " outliers=" << outlier_channels;
  if (format == KvFormat::nvfp4) os << " k_global=" << k_global_scale << " v_global=" << v_global_scale;
  os << " seq_lens=[";
  for (size_t i = 0; i < seq_lens.size(); ++i) os << (i ? "," : "") << seq_lens[i];
  os << "]";
  return os.str();
}

KvCacheView HostProblem::cache_view() const {
  KvCacheView v;
  v.layout = layout;
  v.k = const_cast<uint8_t*>(k_cache.data());
  v.v = const_cast<uint8_t*>(v_cache.data());
  v.scales = scales;
  return v;
}

AttnArgs HostProblem::device_args(const bf16* q_, void* k_, void* v_, const int32_t* tables_,
                                    const int32_t* lens_, bf16* out) const {
  AttnArgs a;
  a.q = q_;
  a.q_stride = q_stride;
  a.q_head_stride = q_head_stride;
  a.num_seqs = num_seqs();
  a.num_q_heads = num_q_heads();
  a.cache.layout = layout;
  a.cache.k = k_;
  a.cache.v = v_;
  a.cache.scales = scales;
  a.block_tables = tables_;
  a.max_blocks_per_seq = max_blocks_per_seq;
  a.seq_lens = lens_;
  a.sliding_window = c.sliding_window;
  a.sm_scale = sm_scale;
  a.out = out;
  return a;
}

AttnArgs HostProblem::args(bf16* out) const {
  return device_args(q.data(), const_cast<uint8_t*>(k_cache.data()), const_cast<uint8_t*>(v_cache.data()),
                     block_tables.data(), seq_lens.data(), out);
}

CacheWriteArgs HostProblem::device_write_args(const bf16* key_, const bf16* value_, const int64_t* slots_,
                                              void* k_, void* v_, int32_t* skipped) const {
  CacheWriteArgs w;
  w.key = key_;
  w.key_stride = kv_row_stride;
  w.value = value_;
  w.value_stride = kv_row_stride;
  w.slot_mapping = slots_;
  w.num_tokens = num_tokens();
  w.cache.layout = layout;
  w.cache.k = k_;
  w.cache.v = v_;
  w.cache.scales = scales;
  w.skipped = skipped;
  return w;
}

CacheWriteArgs HostProblem::write_args() const {
  return device_write_args(key.data(), value.data(), slot_mapping.data(), const_cast<uint8_t*>(k_cache.data()),
                           const_cast<uint8_t*>(v_cache.data()));
}

void poison_cache(HostProblem& p, char which, int32_t seq, int32_t pos, int32_t h, int32_t d) {
  const KvCacheLayout& l = p.layout;
  const int64_t block = p.block_tables[size_t(seq) * p.max_blocks_per_seq + pos / l.block_size];
  if (block < 0 || block >= l.num_blocks)  // an entry make_problem left invalid (before the window) or a test corrupted
    throw std::invalid_argument("poison_cache: position " + std::to_string(pos) + " of sequence " +
                                std::to_string(seq) + " is not on an allocated page");
  const int64_t row = int64_t(pos % l.block_size) * l.num_kv_heads + h;
  uint8_t* page = (which == 'k' ? p.k_cache.data() : p.v_cache.data()) + block * l.page_stride_bytes;
  switch (l.format) {
    case KvFormat::bf16:
      page[(row * l.head_dim + d) * 2] = 0xc0;
      page[(row * l.head_dim + d) * 2 + 1] = 0x7f;
      break;
    case KvFormat::fp8_e4m3: page[row * l.head_dim + d] = codec::kE4M3NaN; break;
    case KvFormat::nvfp4: page[l.data_section_bytes + row * (l.head_dim / 16) + d / 16] = codec::kE4M3NaN; break;
  }
}

std::vector<double> reference_attention(const HostProblem& p) { return reference_attention(p.args(nullptr)); }

HostProblem make_problem(const DecodeCase& c, uint64_t seed) {
  if (c.q_stride_pad % 8 || c.kv_row_pad % 8 || c.page_pad_bytes % 16 || c.q_stride_pad < 0 || c.kv_row_pad < 0 ||
      c.page_pad_bytes < 0 || c.extra_blocks < 0 || c.group < 1)
    throw std::invalid_argument("make_problem: bad DecodeCase: " + c.describe());
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unif(0.0f, 1.0f);

  HostProblem p;
  p.c = c;
  p.seq_lens = c.seq_lens;
  const int32_t D = c.head_dim, B = c.block_size, H = c.num_kv_heads, Hq = c.num_q_heads();
  const int32_t S = int32_t(c.seq_lens.size());
  const int64_t HD = int64_t(H) * D;

  // Pages: each sequence gets the pages of its attended range (pages wholly
  // before its window are never allocated, as a sliding-window engine frees them).
  int64_t needed = 0;
  int32_t max_pages = 0;
  for (int32_t L : c.seq_lens) {
    if (L < 0) throw std::invalid_argument("make_problem: negative seq_len");
    const PageRange r = attended_pages(L, c.sliding_window, B);
    needed += r.end - r.first;
    max_pages = std::max(max_pages, r.end);
  }
  const int64_t num_blocks = std::max<int64_t>(1, needed + c.extra_blocks);
  p.max_blocks_per_seq = max_pages + 1;

  switch (c.format) {
    case KvFormat::bf16:
      p.layout = KvCacheLayout::bf16(num_blocks, B, H, D);
      if (c.page_pad_bytes) {
        p.layout.page_stride_bytes += c.page_pad_bytes;
        p.layout.validate();
      }
      break;
    case KvFormat::fp8_e4m3:
      p.layout = KvCacheLayout::fp8(num_blocks, B, H, D, c.page_pad_bytes ? B * HD + c.page_pad_bytes : 0);
      break;
    case KvFormat::nvfp4: {
      const int64_t data = B * HD / 2, scales = B * HD / 16;
      const int64_t gap = c.page_pad_bytes ? 16 : 0;
      p.layout = KvCacheLayout::nvfp4(num_blocks, B, H, D, data + gap + scales + c.page_pad_bytes, data + gap);
      break;
    }
  }

  // Block tables: every entry starts INVALID (alternately negative and >= num_blocks).
  p.block_tables.resize(size_t(S) * p.max_blocks_per_seq);
  for (size_t i = 0; i < p.block_tables.size(); ++i)
    p.block_tables[i] = (i % 2 == 0) ? -1 - int32_t(i % 977) : int32_t(num_blocks + int64_t(i % 977));
  std::vector<int32_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  int64_t next_page = 0;

  // Tokens to write: positions [first attended page * B, L) of every sequence.
  std::vector<int64_t> slots;
  for (int32_t s = 0; s < S; ++s) {
    const int32_t L = c.seq_lens[s];
    const PageRange r = attended_pages(L, c.sliding_window, B);
    for (int32_t pg = r.first; pg < r.end; ++pg) {
      const int32_t id = perm[next_page++];
      p.block_tables[size_t(s) * p.max_blocks_per_seq + pg] = id;
      for (int32_t t = pg * B; t < std::min(L, (pg + 1) * B); ++t) slots.push_back(int64_t(id) * B + (t - pg * B));
    }
  }
  // Token order is arbitrary in a batch; a couple of padding tokens (slot -1).
  std::shuffle(slots.begin(), slots.end(), rng);
  for (int i = 0; i < 2 && !slots.empty(); ++i)
    slots.insert(slots.begin() + int64_t(rng() % (slots.size() + 1)), int64_t(-1 - i));
  p.slot_mapping = slots;

  // K and V rows: per-head magnitudes varied over ~8x; K gets a few outlier
  // channels per kv head. Row padding holds NaN so a reader that strays into it is caught.
  p.kv_row_stride = HD + c.kv_row_pad;
  const int64_t T = int64_t(slots.size());
  p.key.assign(size_t(T * p.kv_row_stride), kNaNBf16);
  p.value.assign(size_t(T * p.kv_row_stride), kNaNBf16);
  std::vector<float> k_mag(H), v_mag(H), channel_gain(size_t(HD), 1.0f);
  for (int32_t h = 0; h < H; ++h) {
    k_mag[h] = std::exp2(3.0f * unif(rng) - 1.5f);
    v_mag[h] = std::exp2(3.0f * unif(rng) - 1.5f);
    if (c.outlier_channels)
      for (int i = 0; i < 3; ++i) channel_gain[size_t(h) * D + rng() % D] = 8.0f + 12.0f * unif(rng);
  }
  for (int64_t j = 0; j < T; ++j)
    for (int64_t i = 0; i < HD; ++i) {
      p.key[j * p.kv_row_stride + i] = to_bf16(normal(rng) * k_mag[i / D] * channel_gain[i]);
      p.value[j * p.kv_row_stride + i] = to_bf16(normal(rng) * v_mag[i / D]);
    }

  // Scales.
  const float k_absmax = rows_absmax(p.key, p.kv_row_stride, HD, slots);
  const float v_absmax = rows_absmax(p.value, p.kv_row_stride, HD, slots);
  if (c.format == KvFormat::fp8_e4m3) {
    p.scales.k_scale = fp8_scale_from_absmax(k_absmax);
    p.scales.v_scale = fp8_scale_from_absmax(v_absmax);
  } else if (c.format == KvFormat::nvfp4) {
    p.scales.k_global_scale = c.k_global_scale > 0 ? c.k_global_scale : nvfp4_global_scale_from_absmax(k_absmax);
    p.scales.v_global_scale = c.v_global_scale > 0 ? c.v_global_scale : nvfp4_global_scale_from_absmax(v_absmax);
  }

  // Caches: random garbage first (unwritten slots and page padding are never zeros), then the writes.
  p.k_cache.resize(size_t(p.layout.cache_bytes()));
  p.v_cache.resize(size_t(p.layout.cache_bytes()));
  for (auto* cache : {&p.k_cache, &p.v_cache})
    for (size_t i = 0; i < cache->size(); i += 8) {
      const uint64_t r = rng();
      for (size_t b = 0; b < 8 && i + b < cache->size(); ++b) (*cache)[i + b] = uint8_t(r >> (8 * b));
    }
  cpu::reshape_and_cache(p.write_args());

  // Queries; padding holds NaN.
  const QLayout ql = q_layout(c, S);
  p.q_stride = ql.row_stride;
  p.q_head_stride = ql.head_stride;
  p.q.assign(ql.elems, kNaNBf16);
  for (int32_t s = 0; s < S; ++s)
    for (int32_t h = 0; h < Hq; ++h)
      for (int32_t d = 0; d < D; ++d) p.q[size_t(s * ql.row_stride + h * ql.head_stride + d)] = to_bf16(normal(rng));
  p.sm_scale = 1.0f / std::sqrt(float(D));
  return p;
}

uint64_t random_seed() {
  std::random_device rd;
  return (uint64_t(rd()) << 32) ^ uint64_t(rd());
}

std::vector<bf16> poisoned_bf16(size_t n) { return std::vector<bf16>(n, bf16{kPoisonBf16}); }

int64_t count_poison(const bf16* x, size_t n) {
  int64_t k = 0;
  for (size_t i = 0; i < n; ++i) k += x[i].bits == kPoisonBf16;
  return k;
}

std::vector<int32_t> interesting_lengths(int32_t block_size, int32_t max_len, int32_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  // 0 and 1 always (when n >= 4), then page multiples and their neighbours,
  // then random lengths for the remaining ~half.
  std::vector<int32_t> pool;
  for (int32_t k = 1; k <= 4; ++k)
    for (int32_t d = -1; d <= 1; ++d) pool.push_back(k * block_size + d);
  pool.erase(std::remove_if(pool.begin(), pool.end(), [&](int32_t L) { return L > max_len; }), pool.end());
  std::shuffle(pool.begin(), pool.end(), rng);
  if (n >= 4) pool.insert(pool.begin(), {0, 1});
  std::vector<int32_t> out;
  for (int32_t i = 0; i < n; ++i) {
    if (i < int32_t(pool.size()) && i < n / 2 + 1) out.push_back(pool[i]);
    else out.push_back(int32_t(rng() % uint64_t(max_len + 1)));
  }
  std::shuffle(out.begin(), out.end(), rng);
  return out;
}

}  // namespace metrale::test
