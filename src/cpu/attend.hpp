// The CPU attention core shared by the single pass and split-K, for decode
// and query runs alike (a decode is a run of one row): online softmax of the
// q heads of one GQA group (one query row, one kv head) over a range of its
// sequence's pages, in f32 over the dequantized cache.
#pragma once

#include <cstdint>
#include <vector>

#include "metrale/ops.hpp"

namespace metrale::cpu::detail {

// Per-call constants of a launch (after validation).
struct DecodeContext {
  explicit DecodeContext(const AttnArgs& args);

  const AttnArgs& a;
  int32_t num_kv_heads, head_dim, block_size, group;
  float k_logit_scale;  // sm_scale * per-tensor K scale (fp8 k_scale, nvfp4 k_global_scale)
  float v_out_scale;    // per-tensor V scale, applied to the normalised output

  // Sequence `seq`'s length, clamped to its block-table row (a length past
  // the row's capacity attends only to the positions the row holds; a
  // negative one counts as 0; with a shard view the global length, the view
  // being kv_lens), its query run (first row, rows: clamped to [0, length];
  // one row without q_start).
  int32_t seq_len(int32_t seq) const;
  int32_t first_row(int32_t seq) const { return a.q_start ? a.q_start[seq] : seq; }
  int32_t run_len(int32_t seq) const;

  // Pages of a block-table row and the attended positions [pos_begin, pos_end).
  struct SeqRange {
    PageRange pages;
    int32_t pos_begin, pos_end;
  };
  // What query row j of sequence `seq` attends to (with a shard view: in
  // the view's positions and pages).
  SeqRange query(int32_t seq, int32_t j) const;
  // The pages any row of the run attends to: the range split-K cuts.
  PageRange run_pages(int32_t seq) const;
  // Range r of sequence `seq` as SeqRange (clipped to its shard view, if any).
  SeqRange in_view(int32_t seq, QueryRange r) const;
};

// Online-softmax state of one group: G = group q heads.
struct GroupState {
  void reset(int32_t group, int32_t head_dim, int32_t block_size);

  std::vector<float> q;       // [G][D] f32 query rows, pre-multiplied by k_logit_scale
  float softcap = 0.0f;       // c > 0: logits become c * tanh(logit / c)
  std::vector<float> acc;     // [G][D] sum of p * v (unnormalised, without v_out_scale)
  std::vector<float> m;       // [G] running max of the non-NaN logits (-inf: none yet)
  std::vector<float> l;       // [G] sum of exp(logit - m)
  std::vector<uint8_t> nan;   // [G] a NaN logit was seen: the head's result is NaN
  std::vector<float> k, v;    // [D] the dequantized row being served
  std::vector<float> p;       // [G][block_size] logits, then probabilities, of one page
};

// Loads the group's q heads of query row `row` into st.q and clears the state.
void load_group(const DecodeContext& c, int32_t row, int32_t kv_head, GroupState& st);

// Checks every page id of `pages` in sequence `seq`'s row: false if one is
// outside [0, num_blocks). Such a page is never dereferenced.
bool pages_valid(const DecodeContext& c, int32_t seq, PageRange pages);

// Accumulates positions [pos_begin, pos_end) of `pages` into the state.
// The page ids must have passed pages_valid.
void attend_pages(const DecodeContext& c, int32_t seq, int32_t kv_head, PageRange pages, int32_t pos_begin,
                  int32_t pos_end, GroupState& st);

}  // namespace metrale::cpu::detail
