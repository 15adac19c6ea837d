// The attention plan: every launch decision of one batch shape (which
// kernel, single pass or split-K and num_splits, how splits merge, the grid,
// the workspace), made by ONE function, plan_attention. The support check,
// the workspace sizing and both backends' launchers all go through it;
// run_attention launches what the plan says and decides nothing.
//
// Host-only and cheap: plan once per batch shape, reuse the plan for every
// layer; running a plan never allocates or synchronises. A plan made for a
// problem runs any arguments of the same heads and layout whose sequences,
// query rows and runs fit it (at most num_seqs sequences, num_q_rows rows,
// runs of at most max_q_len rows), at any lengths up to max_seq_len: the
// plan is a performance choice, not a correctness one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "metrale/cache.hpp"
#include "metrale/detail/kernel_launch.hpp"
#include "metrale/ops.hpp"

namespace metrale {

// What a plan is made for. Upper bounds are fine everywhere.
struct AttnProblem {
  int32_t num_seqs = 0;
  int32_t num_q_heads = 0;
  KvCacheLayout layout;        // format, heads, head_dim, block_size
  int32_t max_seq_len = 0;     // longest sequence of the batch
  int32_t sliding_window = 0;  // 0 = off
  // Query runs (docs/spec.md 8): the longest run and the rows of all runs.
  // max_q_len 1: decode. num_q_rows 0: the capacity the other fields imply,
  // num_seqs * max_q_len.
  int32_t max_q_len = 1;
  int32_t num_q_rows = 0;
  // Sinks, soft-cap or lse requested: the runs kernel serves them (decode too).
  bool attn_options = false;
  // Rows given as runs (q_start), whatever their lengths: the runs kernel.
  bool query_runs = false;

  // Whether the plan's kernel is the runs kernel (one definition).
  bool runs_kernel() const { return query_runs || max_q_len > 1 || attn_options; }
  // The query rows the plan is made for (num_q_rows, or num_seqs * max_q_len).
  int64_t rows() const { return num_q_rows > 0 ? num_q_rows : int64_t(num_seqs) * max_q_len; }
};

// The problem of a call's arguments: their sequences, rows, heads, layout,
// window and options. `max_seq_len` < 0: the block table's capacity
// (max_blocks_per_seq * block_size), an upper bound of every length;
// `max_q_len` <= 0 for query runs: that capacity too (runs are never longer
// than their sequence).
AttnProblem attention_problem(const AttnArgs& args, int32_t max_seq_len = -1, int32_t max_q_len = -1);

// The kernel a plan launches: the decode kernel (one row per sequence, up
// to 8 q heads of a kv head per CTA), the runs kernel (query runs, sinks,
// soft-cap, lse: 8-16 (row, q head) columns per CTA), the prefill kernel
// (tensor-core tiles of 128 packed (row, q head) rows per CTA).
enum class AttnKernel : uint8_t { decode, query_runs, prefill };
// How the splits of a plan merge: none (single pass); inside a
// thread-block cluster of the split CTAs through distributed shared memory;
// through the f32 workspace and the reduce kernel; or not at all: the run
// writes the split-K states to the workspace and stops (states_only, for
// states merged elsewhere with reduce_states or across GPUs).
enum class SplitMerge : uint8_t { automatic, single_pass, cluster, workspace, states_only };

const char* to_string(AttnKernel k);
const char* to_string(SplitMerge m);
// The inverse of to_string; InvalidArgument naming `arg` and listing the names.
SplitMerge split_merge_from_string(const std::string& name, const char* arg = "merge");

// The workspace bound of a plan whose options leave max_workspace_bytes 0.
constexpr size_t kDefaultMaxWorkspaceBytes = size_t(4) << 30;

// What a caller decides instead of the planner; 0 / automatic leave it to
// the planner. A forced choice the problem or the target cannot run throws
// Unsupported; a forced split count whose workspace passes the bound throws
// InvalidArgument naming the bytes (the planner's own choices stay inside it).
struct AttnPlanOptions {
  int32_t num_splits = 0;  // 0 = the planner's; 1 = single pass; up to kMaxSplits
  SplitMerge merge = SplitMerge::automatic;
  size_t max_workspace_bytes = 0;  // 0 = kDefaultMaxWorkspaceBytes
};

// What the planner knows of the machine that runs the plan:
// cuda::attention_target() (the current GPU) or cpu::attention_target().
struct AttnTarget {
  int32_t num_sms = 0;  // multiprocessors (the CPU backend: worker threads)
  bool tma = false;     // TMA tensor maps can be encoded (the driver's encoder is there)
  int64_t l2_bytes = 0; // the L2 cache's size (0: unknown)
  // Most clusters of `cluster_size` CTAs of `kernel` resident on the GPU at
  // once; empty or 0: no cluster launches.
  std::function<int64_t(const detail::KernelId& kernel, int32_t cluster_size)> resident_clusters;
};

struct AttnPlan {
  AttnProblem problem;         // what it was made for
  AttnKernel kernel = AttnKernel::decode;
  int32_t num_splits = 1;      // 1 = single pass
  SplitMerge merge = SplitMerge::single_pass;
  size_t workspace_bytes = 0;  // f32 split-K workspace the run needs (workspace, states_only), else 0
  detail::KernelLaunch launch; // the kernel's geometry (internal: metrale/detail/kernel_launch.hpp)

  detail::KernelId kernel_id() const;
  // CTAs of one split for a batch of num_seqs sequences.
  int64_t grid_x(int32_t num_seqs) const { return int64_t(num_seqs) * launch.ctas_per_seq; }
};

// The one decision function. Throws InvalidArgument on a malformed problem
// or target and Unsupported on a forced choice that cannot run.
AttnPlan plan_attention(const AttnProblem& problem, const AttnTarget& target, const AttnPlanOptions& options = {});

// Debug validator (docs/spec.md 6): checks, on host copies, that every
// length is in [0, max_blocks_per_seq * block_size] and that every page a
// sequence attends to is a valid page of the cache. Throws InvalidArgument
// naming the first bad sequence.
void validate_block_tables(const KvCacheLayout& layout, const int32_t* block_tables, int32_t max_blocks_per_seq,
                           const int32_t* seq_lens, int32_t num_seqs, int32_t sliding_window = 0);

}  // namespace metrale
