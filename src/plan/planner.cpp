// The decode planner (docs/planner.md) and the debug block-table validator.
//
// Split rule: a decode launch has one CTA per (sequence, kv head or head
// pair, 8-q-head tile, split). Single pass when the batch alone gives every
// SM enough CTAs; otherwise cut each sequence into as many splits as fill one
// resident wave, but never splits shorter than kMinTokensPerSplit. Splitting
// past one resident wave only adds tails and reduce work (measured with
// `metrale_bench --mode oracle`, bench/RESULTS.md).
//
// Merge rule: 2-8 splits merge inside clusters of the split CTAs where every
// cluster of the grid is resident at once. The merge holds every CTA of a
// cluster until the last one is done, and clusters are placed whole inside
// one GPC: a grid of more clusters than that runs them in waves, and there
// the workspace and the reduce are faster (fp8 d64 4x8192, 32 clusters of
// 8: 25.4 us in clusters against 16.1 through the workspace; session 6 in
// bench/RESULTS.md).
#include <algorithm>
#include <string>

#include "metrale/error.hpp"
#include "metrale/format.hpp"
#include "metrale/plan.hpp"
#include "plan/decode_geometry.hpp"
#include "plan/planner.hpp"

namespace metrale {

using namespace geometry;

size_t splitk_workspace_bytes(int32_t num_seqs, int32_t num_q_heads, int32_t head_dim, int32_t num_splits) {
  return size_t(num_seqs) * size_t(num_q_heads) * size_t(num_splits) * size_t(head_dim + 2) * sizeof(float);
}

const char* to_string(DecodeLoadPath p) {
  switch (p) {
    case DecodeLoadPath::automatic: return "automatic";
    case DecodeLoadPath::registers: return "registers";
    case DecodeLoadPath::tma: return "tma";
  }
  return "unknown";
}

const char* to_string(DecodeMerge m) {
  switch (m) {
    case DecodeMerge::automatic: return "automatic";
    case DecodeMerge::single_pass: return "single_pass";
    case DecodeMerge::cluster: return "cluster";
    case DecodeMerge::workspace: return "workspace";
  }
  return "unknown";
}

const char* to_string(DecodePairing p) {
  switch (p) {
    case DecodePairing::automatic: return "automatic";
    case DecodePairing::off: return "off";
    case DecodePairing::on: return "on";
  }
  return "unknown";
}

namespace {
// The enumerator of E whose to_string is `name`.
template <class E>
E from_string(const std::string& name, const char* arg, std::initializer_list<E> values) {
  std::string names;
  for (E v : values) {
    if (name == to_string(v)) return v;
    names += (names.empty() ? "" : ", ") + std::string(to_string(v));
  }
  detail::throw_invalid(arg, name, "one of " + names);
}
}  // namespace

DecodeLoadPath decode_load_path_from_string(const std::string& name, const char* arg) {
  return from_string(name, arg, {DecodeLoadPath::automatic, DecodeLoadPath::registers, DecodeLoadPath::tma});
}
DecodeMerge decode_merge_from_string(const std::string& name, const char* arg) {
  return from_string(name, arg,
                     {DecodeMerge::automatic, DecodeMerge::single_pass, DecodeMerge::cluster, DecodeMerge::workspace});
}
const char* to_string(DecodePrefill p) {
  switch (p) {
    case DecodePrefill::automatic: return "automatic";
    case DecodePrefill::off: return "off";
    case DecodePrefill::on: return "on";
  }
  return "?";
}
DecodePrefill decode_prefill_from_string(const std::string& name, const char* arg) {
  return from_string(name, arg, {DecodePrefill::automatic, DecodePrefill::off, DecodePrefill::on});
}

DecodePairing decode_pairing_from_string(const std::string& name, const char* arg) {
  return from_string(name, arg, {DecodePairing::automatic, DecodePairing::off, DecodePairing::on});
}

DecodeProblem decode_problem(const PagedAttnArgs& a, int32_t max_seq_len, int32_t max_q_len) {
  const int32_t capacity =
      int32_t(std::min<int64_t>(int64_t(a.max_blocks_per_seq) * a.cache.layout.block_size, INT32_MAX));
  DecodeProblem p;
  p.num_seqs = a.num_seqs;
  p.num_q_heads = a.num_q_heads;
  p.layout = a.cache.layout;
  p.max_seq_len = max_seq_len >= 0 ? max_seq_len : capacity;
  p.sliding_window = a.sliding_window;
  p.max_q_len = a.q_start == nullptr ? 1
                : (max_q_len > 0 ? max_q_len : (a.max_q_len > 0 ? a.max_q_len : std::max(capacity, 1)));
  p.num_q_rows = a.num_q_rows;
  p.attn_options = a.sinks != nullptr || a.softcap > 0.0f || a.lse != nullptr;
  p.query_runs = a.q_start != nullptr;
  return p;
}

DecodeProblem decode_problem(const DecodeArgs& a, int32_t max_seq_len) {
  return decode_problem(attn_args(a), max_seq_len);
}

DecodeKernelId DecodePlan::kernel() const {
  return DecodeKernelId{problem.layout.format, pair_kv_heads ? 2 * problem.layout.head_dim : problem.layout.head_dim,
                        load_path, pair_kv_heads, problem.runs_kernel(), col_tiles, head_dim_parts, prefill,
                        tile_pairs};
}

DecodePlan plan_decode(const DecodeProblem& p, const DecodeTarget& target, const DecodePlanOptions& options) {
  p.layout.validate();
  METRALE_CHECK_ARG(p.num_seqs >= 0, "num_seqs", p.num_seqs, ">= 0");
  METRALE_CHECK_ARG(p.num_q_heads > 0 && p.num_q_heads % p.layout.num_kv_heads == 0, "num_q_heads", p.num_q_heads,
                    "a positive multiple of num_kv_heads = " + std::to_string(p.layout.num_kv_heads));
  METRALE_CHECK_ARG(p.max_seq_len >= 0, "max_seq_len", p.max_seq_len, ">= 0");
  METRALE_CHECK_ARG(p.sliding_window >= 0, "sliding_window", p.sliding_window, ">= 0");
  METRALE_CHECK_ARG(p.max_q_len >= 1, "max_q_len", p.max_q_len, ">= 1");
  METRALE_CHECK_ARG(p.num_q_rows >= 0, "num_q_rows", p.num_q_rows, ">= 0 (0: one row per sequence)");
  return detail::decide_decode_plan(p, target, options);
}

namespace {
// Positions a sequence attends at most (the window's, or max_seq_len).
int64_t attended_len(const DecodeProblem& p) {
  return p.sliding_window > 0 ? std::min<int64_t>(p.max_seq_len, int64_t(p.sliding_window) + p.layout.block_size)
                              : p.max_seq_len;
}

// The planner's split count for a grid of base_ctas CTAs per split: fill one
// resident wave, but never splits shorter than min_tokens.
int32_t fill_splits(int64_t base_ctas, int64_t attended, int64_t wave, int64_t min_tokens = kMinTokensPerSplit) {
  if (base_ctas <= 0 || base_ctas >= wave) return 1;
  const int64_t by_fill = wave / base_ctas;  // stay within one resident wave
  const int64_t by_length = std::max<int64_t>(1, attended / min_tokens);
  return int32_t(std::clamp<int64_t>(std::min(by_fill, by_length), 1, kMaxSplits));
}

// The runs kernel's column tiles where the caller leaves them to the planner:
// geometry::runs_col_tiles (two n-tiles where a kv head has more than 8
// columns), but one where two would leave splits of fewer than 512 tokens
// (2-4 steps per warp: the CTA's fixed costs, doubled columns, dominate), and
// for the formats on the TMA path when the one-tile grid fills less than half
// a wave and needs at most two tiles per kv head (the two one-tile CTAs of a
// kv head, adjacent, the second reading the pages mostly from L2, with fewer,
// longer splits). Measured: bench/RESULTS.md, session 9 (one tile 5-30%
// faster at q_len 4 and 8 at 1 x 4096, and at q_len 4 for bf16/fp8 at
// 1 x 32768 and 4 x 8192; two tiles faster everywhere else, NVFP4 most).
int32_t runs_col_tiles_for(const DecodeProblem& p, const DecodeTarget& target, int32_t kv_units, int64_t columns,
                           int64_t wave, int32_t head_dim_parts) {
  if (!p.runs_kernel()) return 1;
  const int32_t tiles = runs_col_tiles(p.layout.head_dim, head_dim_parts, columns);
  if (tiles == 1) return 1;
  auto ctas_per_split = [&](int32_t t) {
    const int64_t tile_cols = int64_t(kDecodeQHeadsPerCta) * t;
    return int64_t(p.num_seqs) * kv_units * ((columns + tile_cols - 1) / tile_cols);
  };
  const int64_t attended = attended_len(p);
  if (attended / fill_splits(ctas_per_split(tiles), attended, wave) < 4 * kMinTokensPerSplit) return 1;
  const bool tma_format = target.tma && kv_format_desc(p.layout.format).group_size == 0;
  if (tma_format && columns <= 2 * kDecodeQHeadsPerCta && 2 * ctas_per_split(1) < wave) return 1;
  return tiles;
}

// The prefill kernel's K/V loads: TMA boxes for bf16 (the decode kernel's
// tensor maps), registers for the dequantising formats.
bool prefill_loads(const DecodeProblem& p, const DecodeTarget& target) {
  return p.layout.format != KvFormat::bf16 || target.tma;
}
// The prefill kernel's split count for a grid of `ctas` CTAs per split:
// single pass where they fill half the GPU's SMs (one CTA per SM), else as
// many splits as fill one CTA per SM, none shorter than
// kPrefillMinTokensPerSplit positions.
int32_t prefill_splits(const DecodeProblem& p, const DecodeTarget& target, int64_t ctas) {
  if (2 * ctas >= target.num_sms) return 1;
  return fill_splits(ctas, attended_len(p), target.num_sms, kPrefillMinTokensPerSplit);
}
// The prefill kernel's launch order (kernels/prefill/prefill_kernel.cuh,
// prefill_item) takes the row tiles in bands, longest first, and within a
// band one kv unit's CTAs (all sequences) after another, so that the CTAs in
// flight read few kv heads' pages, which then stay in L2. A band fills a
// wave from one unit (num_sms CTAs), but a run has at least 4 bands: the
// last CTAs started are then short ones. Only where the sequences' K and V
// (every kv head's, of the attended positions: an upper bound) exceed the
// L2; below it 0: the three-dimensional grid's order (tile major, then
// sequence, kv unit fastest), which the bands of one tile lost 2-3% to at
// 1024 tokens.
// (Session 19, calls 2-3: bands everywhere lost 7-10% at 1024 tokens and 3%
// at 4096, and gained only at head_dim 256 from 16384 tokens, 2-7%, and on
// ragged8, 4-10%; one band, unit after unit, lost 24% at 1024. Session 20,
// call 2: bands above L2 only, 0.99-1.00x at 1024 / 4096, 1.02-1.04x from
// 16384 tokens, ragged8 1.04-1.13x at d128 / d256.)
int32_t prefill_tile_band(const DecodeProblem& p, const DecodeTarget& target, int32_t head_tiles) {
  const KvFormatDesc& f = kv_format_desc(p.layout.format);
  const int64_t row_bytes = f.row_code_bytes(p.layout.head_dim) + f.row_scale_bytes(p.layout.head_dim);
  const int64_t kv_bytes = 2 * row_bytes * attended_len(p) * p.layout.num_kv_heads * p.num_seqs;  // at most
  // One tile per run (verification): no two CTAs read the same pages.
  if (head_tiles < 2 || target.l2_bytes <= 0 || kv_bytes <= target.l2_bytes) return 0;
  const int64_t fill = (int64_t(target.num_sms) + p.num_seqs - 1) / std::max<int64_t>(p.num_seqs, 1);
  return int32_t(std::max<int64_t>(1, std::min<int64_t>(fill, (int64_t(head_tiles) + 3) / 4)));
}
// Query runs take the prefill kernel where a kv head has at least
// kPrefillMinRows packed rows (kPrefillRowsPerCta over fewer than kPrefillShortRunsMinAttended
// positions) and its grid (one CTA per 128 rows and split) fills half the GPU's
// SMs; fewer CTAs (a short context) leave the SMs idle that the runs
// kernel's splits would fill. Forced split counts (but 1), column tiles or
// the cluster merge keep the runs kernel.
bool prefill_takes(const DecodeProblem& p, const DecodeTarget& target, int32_t kv_units, int64_t columns,
                   int64_t tiles, const DecodePlanOptions& opt) {
  if (!prefill_loads(p, target)) return false;
  const int32_t min_rows = attended_len(p) < kPrefillShortRunsMinAttended ? kPrefillRowsPerCta : kPrefillMinRows;
  if (!p.runs_kernel() || opt.num_splits > 1 || opt.col_tiles > 0 || opt.head_dim_parts > 0 || columns < min_rows)
    return false;
  if (opt.merge == DecodeMerge::cluster) return false;
  if (p.num_seqs > kPrefillMaxGridYZ || tiles > kPrefillMaxGridYZ) return false;  // the grid's y and z
  const int64_t ctas = int64_t(p.num_seqs) * kv_units * tiles;
  const bool one = opt.num_splits == 1 || opt.merge == DecodeMerge::single_pass;
  return 2 * ctas * (one ? 1 : prefill_splits(p, target, ctas)) >= target.num_sms;
}
}  // namespace

DecodePlan detail::decide_decode_plan(const DecodeProblem& p, const DecodeTarget& target,
                                      const DecodePlanOptions& opt) {
  METRALE_CHECK_ARG(target.num_sms > 0, "num_sms", target.num_sms, "> 0");
  METRALE_CHECK_ARG(opt.num_splits >= 0 && opt.num_splits <= kMaxSplits, "num_splits", opt.num_splits,
                    "0 (the planner's) or 1.." + std::to_string(kMaxSplits));

  DecodePlan plan;
  plan.problem = p;
  const int32_t D = p.layout.head_dim, H = p.layout.num_kv_heads, group = p.num_q_heads / H;

  // Pairing of kv heads (decode_geometry.hpp).
  switch (opt.pairing) {
    case DecodePairing::automatic:
      plan.pair_kv_heads =
          !p.runs_kernel() && decode_pairs_kv_heads(D, H, group, p.num_seqs, target.num_sms);
      break;
    case DecodePairing::off: plan.pair_kv_heads = false; break;
    case DecodePairing::on:
      if (!decode_can_pair_kv_heads(D, H, group) || p.runs_kernel())
        detail::throw_unsupported("pairing", "on",
                                  "decode (runs of one row) at head_dim 64, an even num_kv_heads and at most 4 q "
                                  "heads per kv head");
      plan.pair_kv_heads = true;
      break;
  }
  plan.kv_units = plan.pair_kv_heads ? H / 2 : H;
  plan.unit_group = plan.pair_kv_heads ? 2 * group : group;
  // A CTA's columns are (query row, q head) pairs of its kv unit: a run of n
  // rows fills ceil(n * unit_group / (8 * col_tiles)) tiles.
  const int64_t columns = int64_t(p.max_q_len) * plan.unit_group;
  const bool runs = p.runs_kernel();
  METRALE_CHECK_ARG(opt.col_tiles >= 0 && opt.col_tiles <= kMaxRunsColTiles, "col_tiles", opt.col_tiles,
                    "0 (the planner's) or 1.." + std::to_string(kMaxRunsColTiles));
  METRALE_CHECK_ARG(opt.head_dim_parts >= 0 && opt.head_dim_parts <= 2, "head_dim_parts", opt.head_dim_parts,
                    "0 (the planner's), 1 or 2");
  const bool can_split_head_dim = runs && runs_can_split_head_dim(kv_format_desc(p.layout.format).group_size > 0, D);
  if (opt.head_dim_parts == 2 && !can_split_head_dim)
    detail::throw_unsupported("head_dim_parts", 2,
                              "1 except for query runs (or attention options) over NVFP4 at head_dim 256");
  // The runs kernel's parts of head_dim: the caller's, or two where they
  // can be and the CTA takes more than 8 columns (or 2 forced n-tiles).
  int32_t parts = opt.head_dim_parts;
  if (parts == 0)
    parts = can_split_head_dim && (opt.col_tiles == 0 ? columns > kDecodeQHeadsPerCta : opt.col_tiles > 1) ? 2 : 1;
  if ((opt.col_tiles > 1 && (!runs || (D > 128 && parts == 1))) || (parts == 2 && opt.col_tiles == 1))
    detail::throw_unsupported("col_tiles", opt.col_tiles,
                              "1 except for query runs (or attention options) at head_dim <= 128 or with "
                              "head_dim_parts 2; 2 with head_dim_parts 2");
  const int64_t wave = int64_t(target.num_sms) * kDecodeCtasPerSm;

  // The prefill kernel: tiles of kPrefillRowsPerCta packed rows, split-K where its grid is short.
  const int64_t prefill_tiles = (columns + kPrefillRowsPerCta - 1) / kPrefillRowsPerCta;
  METRALE_CHECK_ARG(opt.tile_band >= -1, "tile_band", opt.tile_band, ">= -1 (-1: the planner's order)");
  if (opt.tile_band >= 0 && opt.prefill != DecodePrefill::on)
    detail::throw_unsupported("tile_band", opt.tile_band,
                              "-1 unless prefill is on (the prefill kernel's launch order)");
  METRALE_CHECK_ARG(opt.tile_pairs >= -1 && opt.tile_pairs <= 1, "tile_pairs", opt.tile_pairs,
                    "-1 (the planner's), 0 or 1");
  if (opt.tile_pairs >= 0 && opt.prefill != DecodePrefill::on)
    detail::throw_unsupported("tile_pairs", opt.tile_pairs, "-1 unless prefill is on (the prefill kernel's CTA pairs)");
  switch (opt.prefill) {
    case DecodePrefill::automatic:
      plan.prefill = prefill_takes(p, target, plan.kv_units, columns, prefill_tiles, opt);
      break;
    case DecodePrefill::off: plan.prefill = false; break;
    case DecodePrefill::on:
      if (!runs || opt.col_tiles > 0 || opt.head_dim_parts > 0 || plan.pair_kv_heads ||
          opt.merge == DecodeMerge::cluster)
        detail::throw_unsupported("prefill", "on",
                                  "query runs (or attention options), no col_tiles, head_dim_parts, pairing or "
                                  "cluster merge");
      if (!prefill_loads(p, target))
        detail::throw_unsupported("prefill", "on", "a target that encodes TMA tensor maps for a bf16 cache");
      plan.prefill = true;
      break;
  }
  if (plan.prefill) {
    if (prefill_tiles > kPrefillMaxGridYZ)
      detail::throw_unsupported("prefill", "on", "max_q_len * q heads per kv head <= 65535 * 128 (the grid's z)");
    if (p.num_seqs > kPrefillMaxGridYZ)
      detail::throw_unsupported("prefill", "on", "num_seqs <= 65535 (the grid's y)");
    plan.head_tiles = int32_t(prefill_tiles);
    plan.tile_band = opt.tile_band >= 0 ? std::min(opt.tile_band, plan.head_tiles)
                                        : prefill_tile_band(p, target, plan.head_tiles);
    // CTA pairs (decode_geometry.hpp), forced or the planner's, where a run
    // has two row tiles: an odd tile count gets an empty last tile, and
    // bands whole pairs.
    const bool dequantised = kv_format_desc(p.layout.format).code_bits < 16;
    plan.tile_pairs = plan.head_tiles >= 2 && plan.head_tiles < kPrefillMaxGridYZ &&
                      (opt.tile_pairs == 1 ? prefill_can_pair_tiles(dequantised, D)
                                           : opt.tile_pairs == -1 && prefill_pairs_tiles(dequantised, D, attended_len(p)));
    if (plan.tile_pairs) {
      plan.head_tiles += plan.head_tiles % 2;
      plan.tile_band += plan.tile_band % 2;
    }
    plan.ctas_per_seq = int64_t(plan.kv_units) * plan.head_tiles;
    plan.num_splits = opt.num_splits > 0                    ? opt.num_splits
                      : opt.merge == DecodeMerge::single_pass ? 1
                                                              : prefill_splits(p, target, plan.grid_x(p.num_seqs));
    if (opt.merge == DecodeMerge::single_pass && plan.num_splits != 1)
      detail::throw_invalid("merge", "single_pass", "num_splits 1");
    // Its splits merge through the workspace (no cluster merge).
    plan.merge = plan.num_splits == 1 && opt.merge != DecodeMerge::workspace ? DecodeMerge::single_pass
                                                                               : DecodeMerge::workspace;
    plan.load_path = p.layout.format == KvFormat::bf16 ? DecodeLoadPath::tma : DecodeLoadPath::registers;
    if (plan.merge == DecodeMerge::workspace)
      plan.workspace_bytes = splitk_workspace_bytes(decode_problem_rows(p), p.num_q_heads, D, plan.num_splits);
    return plan;
  }
  plan.col_tiles =
      opt.col_tiles > 0 ? opt.col_tiles : runs_col_tiles_for(p, target, plan.kv_units, columns, wave, parts);
  // One n-tile takes whole rows (the planner's parts only: forced 2 with one tile threw above).
  plan.head_dim_parts = plan.col_tiles == 1 ? 1 : parts;
  const int64_t tile_cols = int64_t(kDecodeQHeadsPerCta) * plan.col_tiles;
  plan.head_tiles = int32_t((columns + tile_cols - 1) / tile_cols);
  plan.ctas_per_seq = int64_t(plan.kv_units) * plan.head_tiles;
  const int64_t base_ctas = plan.grid_x(p.num_seqs);

  // Splits.
  if (opt.num_splits > 0) {
    plan.num_splits = opt.num_splits;
  } else {
    plan.num_splits = fill_splits(base_ctas, attended_len(p), wave);
  }

  // Load path: TMA for the formats without a scale section wherever the
  // target encodes tensor maps (the TMA ring carries no scale rows; the
  // NVFP4 kernel is instruction-bound: docs/decisions.md).
  const bool tma_ok = target.tma && kv_format_desc(p.layout.format).group_size == 0;
  switch (opt.load_path) {
    case DecodeLoadPath::automatic:
    case DecodeLoadPath::tma:
      if (opt.load_path == DecodeLoadPath::tma && !tma_ok)
        detail::throw_unsupported("load_path", "tma", "bf16 or fp8 on a target that encodes TMA tensor maps");
      plan.load_path = tma_ok ? DecodeLoadPath::tma : DecodeLoadPath::registers;
      break;
    case DecodeLoadPath::registers: plan.load_path = DecodeLoadPath::registers; break;
  }

  // Merge.
  const bool clusterable = plan.num_splits >= 2 && plan.num_splits <= kMaxClusterSplits && target.resident_clusters &&
                           (opt.merge == DecodeMerge::automatic || opt.merge == DecodeMerge::cluster);
  const int64_t resident = clusterable ? target.resident_clusters(plan.kernel(), plan.num_splits) : 0;
  switch (opt.merge) {
    case DecodeMerge::automatic:
      plan.merge = plan.num_splits == 1                           ? DecodeMerge::single_pass
                   : (resident > 0 && base_ctas <= resident) ? DecodeMerge::cluster
                                                                : DecodeMerge::workspace;
      break;
    case DecodeMerge::single_pass:
      if (plan.num_splits != 1) detail::throw_invalid("merge", "single_pass", "num_splits 1");
      plan.merge = DecodeMerge::single_pass;
      break;
    case DecodeMerge::cluster:
      if (resident <= 0)
        detail::throw_unsupported("merge", "cluster",
                                  "2.." + std::to_string(kMaxClusterSplits) + " splits on a target with clusters");
      plan.merge = DecodeMerge::cluster;
      break;
    case DecodeMerge::workspace: plan.merge = DecodeMerge::workspace; break;
  }
  if (plan.merge == DecodeMerge::workspace)
    plan.workspace_bytes = splitk_workspace_bytes(decode_problem_rows(p), p.num_q_heads, D, plan.num_splits);
  return plan;
}

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
