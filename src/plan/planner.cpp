// The planner (docs/planner.md): one decision function for every query shape.
//
// Split rule: a decode launch has one CTA per (sequence, kv head or head
// pair, 8-q-head tile, split). Single pass when the batch alone gives every
// SM enough CTAs; otherwise cut each sequence into as many splits as fill one
// resident wave, but never splits shorter than kMinTokensPerSplit. Splitting
// past one resident wave only adds tails and reduce work (measured with
// `metrale_bench --mode oracle`).
//
// Merge rule: 2-8 splits merge inside clusters of the split CTAs where every
// cluster of the grid is resident at once. The merge holds every CTA of a
// cluster until the last one is done, and clusters are placed whole inside
// one GPC: a grid of more clusters than that runs them in waves, and there
// the workspace and the reduce are faster (fp8 d64 4x8192, 32 clusters of
// 8, ran 1.6x slower in clusters).
#include <algorithm>
#include <string>

#include "metrale/error.hpp"
#include "metrale/format.hpp"
#include "metrale/plan.hpp"
#include "plan/decode_geometry.hpp"
#include "plan/planner.hpp"
#include "plan/prefill_staging.hpp"
#include "plan/tuning.hpp"
#include "plan/workspace_bound.hpp"

namespace metrale {

using namespace geometry;

AttnPlan plan_attention(const AttnProblem& p, const AttnTarget& target, const AttnPlanOptions& options) {
  return detail::plan_attention(p, target, options, detail::TuningOptions{});
}

AttnPlan detail::plan_attention(const AttnProblem& p, const AttnTarget& target, const AttnPlanOptions& options,
                                const TuningOptions& tuning) {
  p.layout.validate();
  METRALE_CHECK_ARG(p.num_seqs >= 0, "num_seqs", p.num_seqs, ">= 0");
  METRALE_CHECK_ARG(p.num_q_heads > 0 && p.num_q_heads % p.layout.num_kv_heads == 0, "num_q_heads", p.num_q_heads,
                    "a positive multiple of num_kv_heads = " + std::to_string(p.layout.num_kv_heads));
  METRALE_CHECK_ARG(p.max_seq_len >= 0, "max_seq_len", p.max_seq_len, ">= 0");
  METRALE_CHECK_ARG(p.sliding_window >= 0, "sliding_window", p.sliding_window, ">= 0");
  METRALE_CHECK_ARG(p.max_q_len >= 1, "max_q_len", p.max_q_len, ">= 1");
  METRALE_CHECK_ARG(p.num_q_rows >= 0, "num_q_rows", p.num_q_rows, ">= 0 (0: num_seqs * max_q_len)");
  return detail::decide_plan(p, target, options, tuning);
}

namespace {
// Positions a sequence attends at most (the window's, or max_seq_len).
int64_t attended_len(const AttnProblem& p) {
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
// longer splits): one tile was faster at q_len 4 and 8 at 1 x 4096, and at
// q_len 4 for bf16/fp8 at 1 x 32768 and 4 x 8192; two tiles everywhere
// else, NVFP4 most.
int32_t runs_col_tiles_for(const AttnProblem& p, const AttnTarget& target, int32_t kv_units, int64_t columns,
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
bool prefill_loads(const AttnProblem& p, const AttnTarget& target) {
  return p.layout.format != KvFormat::bf16 || target.tma;
}
// The prefill kernel's split count for a grid of `ctas` CTAs per split:
// single pass where they fill half the GPU's SMs (one CTA per SM), else as
// many splits as fill one CTA per SM, none shorter than
// kPrefillMinTokensPerSplit positions.
int32_t prefill_splits(const AttnProblem& p, const AttnTarget& target, int64_t ctas) {
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
// sequence, kv unit fastest), which the bands beat only where K and V
// spill out of L2 (long prompts, ragged batches); below it they lost.
// `format`: the pages the kernel reads (bf16 where they are staged).
int32_t prefill_tile_band(const AttnProblem& p, const AttnTarget& target, int32_t head_tiles, KvFormat format) {
  const KvFormatDesc& f = kv_format_desc(format);
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
bool prefill_takes(const AttnProblem& p, const AttnTarget& target, int32_t kv_units, int64_t columns,
                   int64_t tiles, const AttnPlanOptions& opt, const detail::TuningOptions& tune) {
  if (!prefill_loads(p, target)) return false;
  const int32_t min_rows = attended_len(p) < kPrefillShortRunsMinAttended ? kPrefillRowsPerCta : kPrefillMinRows;
  if (!p.runs_kernel() || opt.num_splits > 1 || tune.col_tiles > 0 || tune.head_dim_parts > 0 || columns < min_rows)
    return false;
  if (opt.merge == SplitMerge::cluster) return false;
  if (p.num_seqs > kPrefillMaxGridYZ || tiles > kPrefillMaxGridYZ) return false;  // the grid's y and z
  const int64_t ctas = int64_t(p.num_seqs) * kv_units * tiles;
  const bool one = opt.num_splits == 1 || opt.merge == SplitMerge::single_pass;
  return 2 * ctas * (one ? 1 : prefill_splits(p, target, ctas)) >= target.num_sms;
}

// Whether a prefill plan stages its pages (plan/prefill_staging.hpp): an
// FP8 or NVFP4 cache on a target with TMA (the bf16 kernel's loads), runs of
// up to at least kPrefillStageMinRun rows, and staged pages within half the
// workspace bound (the split-K records keep the rest); `on` forces it
// wherever it can run.
bool prefill_stages_kv(const AttnProblem& p, const AttnTarget& target, const AttnPlanOptions& opt,
                       const detail::TuningOptions& tune) {
  const bool can = p.layout.format != KvFormat::bf16 && target.tma && p.max_seq_len > 0;  // pages to stage
  const size_t bound = opt.max_workspace_bytes ? opt.max_workspace_bytes : kDefaultMaxWorkspaceBytes;
  const size_t bytes = prefill_staging(p).bytes;
  switch (tune.stage_kv) {
    case detail::Toggle::off: return false;
    case detail::Toggle::on:
      if (!can)
        detail::throw_unsupported("stage_kv", "on",
                                  "an FP8 or NVFP4 cache on a target that encodes TMA tensor maps, max_seq_len > 0");
      if (bytes > bound)
        detail::throw_invalid("stage_kv", detail::concat("on: ", bytes, " bytes of staged pages"),
                              detail::concat("staged pages within max_workspace_bytes = ", bound, " bytes"));
      return true;
    case detail::Toggle::automatic: break;
  }
  return can && p.max_q_len >= kPrefillStageMinRun && bytes <= bound / 2;
}

// A plan's split count: the forced one, 1 for a single-pass merge left to the
// planner, else the planner's own (`own()`); a single-pass merge with a
// forced count other than 1 is refused.
template <class Own>
int32_t split_count(const AttnPlanOptions& opt, Own own) {
  const int32_t n = opt.num_splits > 0 ? opt.num_splits : opt.merge == SplitMerge::single_pass ? 1 : own();
  if (opt.merge == SplitMerge::single_pass && n != 1) detail::throw_invalid("merge", "single_pass", "num_splits 1");
  return n;
}

// A CTA's kv unit: one kv head, or a pair of them (decode_geometry.hpp),
// forced or the planner's.
void decide_kv_units(AttnPlan& plan, const AttnTarget& target, const detail::TuningOptions& tune) {
  const AttnProblem& p = plan.problem;
  const int32_t D = p.layout.head_dim, H = p.layout.num_kv_heads, group = p.num_q_heads / H;
  switch (tune.pairing) {
    case detail::Toggle::automatic:
      plan.launch.pair_kv_heads = !p.runs_kernel() && decode_pairs_kv_heads(D, H, group, p.num_seqs, target.num_sms);
      break;
    case detail::Toggle::off: plan.launch.pair_kv_heads = false; break;
    case detail::Toggle::on:
      if (!decode_can_pair_kv_heads(D, H, group) || p.runs_kernel())
        detail::throw_unsupported("pairing", "on",
                                  "decode (runs of one row) at head_dim 64, an even num_kv_heads and at most 4 q "
                                  "heads per kv head");
      plan.launch.pair_kv_heads = true;
      break;
  }
  plan.launch.kv_units = plan.launch.pair_kv_heads ? H / 2 : H;
  plan.launch.unit_group = plan.launch.pair_kv_heads ? 2 * group : group;
}

// The runs kernel's parts of head_dim: the caller's, or two where they can
// be and the CTA takes more than 8 columns (or 2 forced n-tiles); refuses
// forced column tiles and parts that cannot run together.
int32_t decide_head_dim_parts(const AttnProblem& p, int64_t columns, const detail::TuningOptions& tune) {
  METRALE_CHECK_ARG(tune.col_tiles >= 0 && tune.col_tiles <= kMaxRunsColTiles, "col_tiles", tune.col_tiles,
                    "0 (the planner's) or 1.." + std::to_string(kMaxRunsColTiles));
  METRALE_CHECK_ARG(tune.head_dim_parts >= 0 && tune.head_dim_parts <= 2, "head_dim_parts", tune.head_dim_parts,
                    "0 (the planner's), 1 or 2");
  const bool runs = p.runs_kernel();
  const bool can_split = runs && runs_can_split_head_dim(kv_format_desc(p.layout.format).group_size > 0,
                                                         p.layout.head_dim);
  if (tune.head_dim_parts == 2 && !can_split)
    detail::throw_unsupported("head_dim_parts", 2,
                              "1 except for query runs (or attention options) over NVFP4 at head_dim 256");
  int32_t parts = tune.head_dim_parts;
  if (parts == 0)
    parts = can_split && (tune.col_tiles == 0 ? columns > kDecodeQHeadsPerCta : tune.col_tiles > 1) ? 2 : 1;
  if ((tune.col_tiles > 1 && (!runs || (p.layout.head_dim > 128 && parts == 1))) ||
      (parts == 2 && tune.col_tiles == 1))
    detail::throw_unsupported("col_tiles", tune.col_tiles,
                              "1 except for query runs (or attention options) at head_dim <= 128 or with "
                              "head_dim_parts 2; 2 with head_dim_parts 2");
  return parts;
}

// The prefill kernel's knobs, which only a forced prefill takes.
void check_prefill_knobs(const detail::TuningOptions& tune) {
  METRALE_CHECK_ARG(tune.tile_band >= -1, "tile_band", tune.tile_band, ">= -1 (-1: the planner's order)");
  if (tune.tile_band >= 0 && tune.prefill != detail::Toggle::on)
    detail::throw_unsupported("tile_band", tune.tile_band,
                              "-1 unless prefill is on (the prefill kernel's launch order)");
  METRALE_CHECK_ARG(tune.tile_pairs >= -1 && tune.tile_pairs <= 1, "tile_pairs", tune.tile_pairs,
                    "-1 (the planner's), 0 or 1");
  if (tune.tile_pairs >= 0 && tune.prefill != detail::Toggle::on)
    detail::throw_unsupported("tile_pairs", tune.tile_pairs,
                              "-1 unless prefill is on (the prefill kernel's CTA pairs)");
  if (tune.stage_kv != detail::Toggle::automatic && tune.prefill != detail::Toggle::on)
    detail::throw_unsupported("stage_kv", to_string(tune.stage_kv),
                              "automatic unless prefill is on (the prefill kernel's staged pages)");
}

// Whether the runs take the prefill kernel: forced, or prefill_takes.
bool decide_prefill(const AttnPlan& plan, const AttnTarget& target, int64_t columns, int64_t tiles,
                    const AttnPlanOptions& opt, const detail::TuningOptions& tune) {
  const AttnProblem& p = plan.problem;
  switch (tune.prefill) {
    case detail::Toggle::automatic: return prefill_takes(p, target, plan.launch.kv_units, columns, tiles, opt, tune);
    case detail::Toggle::off: return false;
    case detail::Toggle::on: break;
  }
  if (!p.runs_kernel() || tune.col_tiles > 0 || tune.head_dim_parts > 0 || plan.launch.pair_kv_heads ||
      opt.merge == SplitMerge::cluster)
    detail::throw_unsupported("prefill", "on",
                              "query runs (or attention options), no col_tiles, head_dim_parts, pairing or "
                              "cluster merge");
  if (!prefill_loads(p, target))
    detail::throw_unsupported("prefill", "on", "a target that encodes TMA tensor maps for a bf16 cache");
  return true;
}

// The prefill kernel's plan of `tiles` row tiles per kv unit: staging, the
// launch order, CTA pairs, splits (merged through the workspace: a cluster
// merge never reaches here) and the workspace.
void plan_prefill(AttnPlan& plan, const AttnTarget& target, int64_t tiles, const AttnPlanOptions& opt,
                  const detail::TuningOptions& tune) {
  const AttnProblem& p = plan.problem;
  if (tiles > kPrefillMaxGridYZ)
    detail::throw_unsupported("prefill", "on", "max_q_len * q heads per kv head <= 65535 * 128 (the grid's z)");
  if (p.num_seqs > kPrefillMaxGridYZ) detail::throw_unsupported("prefill", "on", "num_seqs <= 65535 (the grid's y)");
  detail::KernelLaunch& l = plan.launch;
  l.head_tiles = int32_t(tiles);
  l.stage_kv = prefill_stages_kv(p, target, opt, tune);
  // The pages the kernel reads: the cache's, or the staged bf16 ones.
  const KvFormat read_format = l.stage_kv ? KvFormat::bf16 : p.layout.format;
  l.tile_band = tune.tile_band >= 0 ? std::min(tune.tile_band, l.head_tiles)
                                    : prefill_tile_band(p, target, l.head_tiles, read_format);
  // CTA pairs (decode_geometry.hpp), forced or the planner's, where a run
  // has two row tiles: an odd tile count gets an empty last tile, and
  // bands whole pairs.
  const bool dequantised = kv_format_desc(read_format).code_bits < 16;
  const int32_t D = p.layout.head_dim;
  l.tile_pairs = l.head_tiles >= 2 && l.head_tiles < kPrefillMaxGridYZ &&
                 (tune.tile_pairs == 1 ? prefill_can_pair_tiles(dequantised, D)
                                       : tune.tile_pairs == -1 && prefill_pairs_tiles(dequantised, D, attended_len(p)));
  if (l.tile_pairs) {
    l.head_tiles += l.head_tiles % 2;
    l.tile_band += l.tile_band % 2;
  }
  l.ctas_per_seq = int64_t(l.kv_units) * l.head_tiles;
  plan.num_splits = split_count(opt, [&] { return prefill_splits(p, target, plan.grid_x(p.num_seqs)); });
  plan.merge = opt.merge == SplitMerge::states_only                          ? SplitMerge::states_only
               : plan.num_splits == 1 && opt.merge != SplitMerge::workspace ? SplitMerge::single_pass
                                                                             : SplitMerge::workspace;
  l.load_path = read_format == KvFormat::bf16 ? detail::LoadPath::tma : detail::LoadPath::registers;
  detail::bound_workspace(plan, opt, l.stage_kv ? prefill_staging(p).bytes : 0);
}

// Load path: TMA for the formats without a scale section wherever the
// target encodes tensor maps (the TMA ring carries no scale rows; the NVFP4
// kernel is instruction-bound: docs/decisions.md).
detail::LoadPath decide_load_path(const AttnProblem& p, const AttnTarget& target, const detail::TuningOptions& tune) {
  const bool tma_ok = target.tma && kv_format_desc(p.layout.format).group_size == 0;
  if (tune.load_path == detail::LoadPath::registers) return detail::LoadPath::registers;
  if (tune.load_path == detail::LoadPath::tma && !tma_ok)
    detail::throw_unsupported("load_path", "tma", "bf16 or fp8 on a target that encodes TMA tensor maps");
  return tma_ok ? detail::LoadPath::tma : detail::LoadPath::registers;
}

// How the decode or runs kernel's splits merge: forced, or in clusters where
// every cluster of the grid is resident at once (the file's merge rule).
SplitMerge decide_merge(const AttnPlan& plan, const AttnTarget& target, const AttnPlanOptions& opt) {
  const bool clusterable = plan.num_splits >= 2 && plan.num_splits <= kMaxClusterSplits && target.resident_clusters &&
                           (opt.merge == SplitMerge::automatic || opt.merge == SplitMerge::cluster);
  const int64_t resident = clusterable ? target.resident_clusters(plan.kernel_id(), plan.num_splits) : 0;
  switch (opt.merge) {
    case SplitMerge::automatic:
      if (plan.num_splits == 1) return SplitMerge::single_pass;
      return resident > 0 && plan.grid_x(plan.problem.num_seqs) <= resident ? SplitMerge::cluster
                                                                            : SplitMerge::workspace;
    case SplitMerge::cluster:
      if (resident <= 0)
        detail::throw_unsupported("merge", "cluster",
                                  "2.." + std::to_string(kMaxClusterSplits) + " splits on a target with clusters");
      return SplitMerge::cluster;
    default: return opt.merge;  // single_pass, workspace, states_only
  }
}

// The decode or runs kernel's plan: column tiles, splits, load path, merge
// and the workspace.
void plan_decode(AttnPlan& plan, const AttnTarget& target, int64_t columns, int32_t parts,
                 const AttnPlanOptions& opt, const detail::TuningOptions& tune) {
  const AttnProblem& p = plan.problem;
  detail::KernelLaunch& l = plan.launch;
  const int64_t wave = int64_t(target.num_sms) * kDecodeCtasPerSm;
  l.col_tiles = tune.col_tiles > 0 ? tune.col_tiles : runs_col_tiles_for(p, target, l.kv_units, columns, wave, parts);
  // One n-tile takes whole rows (the planner's parts only: forced 2 with one tile is refused).
  l.head_dim_parts = l.col_tiles == 1 ? 1 : parts;
  const int64_t tile_cols = int64_t(kDecodeQHeadsPerCta) * l.col_tiles;
  l.head_tiles = int32_t((columns + tile_cols - 1) / tile_cols);
  l.ctas_per_seq = int64_t(l.kv_units) * l.head_tiles;
  plan.num_splits = split_count(opt, [&] { return fill_splits(plan.grid_x(p.num_seqs), attended_len(p), wave); });
  l.load_path = decide_load_path(p, target, tune);
  plan.merge = decide_merge(plan, target, opt);
  detail::bound_workspace(plan, opt);
}
}  // namespace

AttnPlan detail::decide_plan(const AttnProblem& p, const AttnTarget& target, const AttnPlanOptions& opt,
                             const TuningOptions& tune) {
  METRALE_CHECK_ARG(target.num_sms > 0, "num_sms", target.num_sms, "> 0");
  METRALE_CHECK_ARG(opt.num_splits >= 0 && opt.num_splits <= kMaxSplits, "num_splits", opt.num_splits,
                    "0 (the planner's) or 1.." + std::to_string(kMaxSplits));
  AttnPlan plan;
  plan.problem = p;
  decide_kv_units(plan, target, tune);
  // A CTA's columns are (query row, q head) pairs of its kv unit: a run of n
  // rows fills ceil(n * unit_group / (8 * col_tiles)) tiles of the decode or
  // runs kernel, ceil(n * unit_group / kPrefillRowsPerCta) of the prefill kernel.
  const int64_t columns = int64_t(p.max_q_len) * plan.launch.unit_group;
  const int32_t parts = decide_head_dim_parts(p, columns, tune);
  check_prefill_knobs(tune);
  const int64_t prefill_tiles = (columns + kPrefillRowsPerCta - 1) / kPrefillRowsPerCta;
  const bool prefill = decide_prefill(plan, target, columns, prefill_tiles, opt, tune);
  plan.kernel = prefill ? AttnKernel::prefill : p.runs_kernel() ? AttnKernel::query_runs : AttnKernel::decode;
  if (prefill)
    plan_prefill(plan, target, prefill_tiles, opt, tune);
  else
    plan_decode(plan, target, columns, parts, opt, tune);
  return plan;
}

}  // namespace metrale
