// Context-parallel decode: one sequence's context (its pages) is
// sharded over R ranks (one GPU each); every rank runs the split-K pass over
// ITS pages only, the ranks exchange their (o, m, l) states (docs/spec.md 4) and
// every rank merges them into the full output. docs/context_parallel.md has
// the design; this header is transport-free (no NCCL): sharding, the record
// layout and the merge on both backends. The NCCL exchange is declared at the
// bottom and defined in the separate static target metrale_nccl.
//
// How a rank expresses "my pages of each sequence" with AttnArgs:
//   * a per-rank block table whose row i lists, in global order, the pages of
//     sequence i that the rank owns AND that lie in the attended range
//     (the window is trimmed on the host, per sequence), and a per-rank length
//     = the tokens of those pages (full pages, plus the sequence's partial
//     last page, which is always the last page of the rank's row when owned);
//   * sliding_window = 0 in the rank's AttnArgs: the window is already
//     applied by the trimming.
// The one position a page-granular shard cannot express is the window's first
// page when the window starts inside it (positions [page*B, L-W) masked, a
// different offset per sequence; AttnArgs has one scalar window). That page
// is cut out of the rank's table and attended by a small "edge" pass that
// writes one extra (o, m, l) record per (seq, q head) on the rank owning it
// (m = -inf, l = 0 elsewhere). It only exists when sliding_window > 0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "metrale/cuda.hpp"
#include "metrale/ops.hpp"
#include "metrale/softmax_state.hpp"

struct ncclComm;  // ncclComm_t = ncclComm* (nccl.h); only metrale_nccl needs the definition

namespace metrale::cp {

// Which rank owns page index p (0-based index into the sequence's block-table
// row, i.e. positions [p*B, (p+1)*B)) of a sequence with n pages.
enum class Sharding : uint8_t {
  contiguous = 0,   // chunks of `chunk_pages` consecutive pages, rank 0 first; the last rank takes the
                    // rest. chunk_pages = 0: ceil(n / R) (even split of the current length, the last
                    // ranks get fewer pages or none).
  interleaved = 1,  // round robin by chunks of `chunk_pages` pages (0 = 1): owner = (p / chunk) % R
};

struct ShardSpec {
  Sharding kind = Sharding::contiguous;
  int32_t num_ranks = 1;
  int32_t chunk_pages = 0;
};

// Owner rank of page p of a sequence of n pages (0 <= p < n). Throws on a bad spec.
int32_t owner_of_page(const ShardSpec& spec, int32_t page, int32_t num_pages);

// The partially masked first page of a window, attended by the edge pass:
// tokens [begin, end) of cache page `page`. page = -1: nothing.
struct EdgeSlice {
  int32_t page = -1;
  int32_t begin = 0;
  int32_t end = 0;
};

// One rank's part of a batch, in host memory. Upload block_tables, seq_lens
// (and edges when the batch has a window) and build the rank's AttnArgs
// with rank_attn_args().
struct RankShard {
  int32_t rank = 0;
  int32_t num_seqs = 0;
  int32_t max_blocks_per_seq = 1;     // row width of block_tables (>= 1)
  std::vector<int32_t> block_tables;  // [num_seqs, max_blocks_per_seq]; unused entries -1
  std::vector<int32_t> seq_lens;      // [num_seqs] tokens the rank's main pass attends
  // [num_seqs, max_blocks_per_seq]: index of local page j in the GLOBAL row (its global positions are
  // [g*B, g*B + B)); -1 for unused entries. Not read by the kernels (they need no positions).
  std::vector<int32_t> global_page;
  std::vector<EdgeSlice> edges;       // [num_seqs]; only meaningful when has_edge
  bool has_edge = false;              // the batch has a sliding window: every rank writes an edge record
  int64_t attended_tokens = 0;        // main pass + edge tokens of this rank over the batch (load balance)
};

// Builds rank `rank`'s shard from the GLOBAL block table and lengths (host
// memory, same contract as AttnArgs) and the batch's sliding window.
RankShard make_rank_shard(const ShardSpec& spec, int32_t rank, const int32_t* block_tables,
                          int32_t max_blocks_per_seq, const int32_t* seq_lens, int32_t num_seqs, int32_t block_size,
                          int32_t sliding_window);
std::vector<RankShard> make_shards(const ShardSpec& spec, const int32_t* block_tables, int32_t max_blocks_per_seq,
                                   const int32_t* seq_lens, int32_t num_seqs, int32_t block_size,
                                   int32_t sliding_window);

// The rank's AttnArgs of a decode over page shards: `global` (q, heads, sm_scale, out, and the RANK'S
// cache view) with the shard's tables/lengths (pointers to the uploaded
// copies), max_blocks_per_seq from the shard, sliding_window = 0.
AttnArgs rank_attn_args(const AttnArgs& global, const RankShard& shard, const int32_t* block_tables,
                            const int32_t* seq_lens);

// Record layout of the exchange. Per rank, one contiguous block of
// rank_floats() f32 (what the all-gather sends):
//   [S*H*splits records: the split-K workspace, index (seq*H + h)*splits + s]
//   [S*H edge records, index seq*H + h]                       (has_edge only)
// each record softmax::record_floats(D) floats (softmax_state.hpp). Gathered: R such blocks, rank-major
// (what ncclAllGather produces). Merged: the split-K layout with
// merged_splits() = R * slots() splits, record ((seq*H + h)*R + r)*slots() + j,
// j < splits the rank's splits, j = splits its edge record: ranks play the
// role of splits, and reduce_states merges them.
struct CpLayout {
  int32_t num_ranks = 1;
  int32_t num_seqs = 0;
  int32_t num_q_heads = 0;
  int32_t head_dim = 0;
  int32_t splits_per_rank = 1;
  bool has_edge = false;

  int32_t slots() const { return splits_per_rank + (has_edge ? 1 : 0); }
  int32_t merged_splits() const { return num_ranks * slots(); }
  size_t record_floats() const { return size_t(softmax::record_floats(head_dim)); }
  size_t splitk_floats() const { return size_t(num_seqs) * num_q_heads * splits_per_rank * record_floats(); }
  size_t rank_floats() const { return size_t(num_seqs) * num_q_heads * slots() * record_floats(); }
  size_t gathered_floats() const { return rank_floats() * num_ranks; }
  size_t merged_floats() const { return gathered_floats(); }
  void validate() const;  // throws InvalidArgument (merged_splits() <= kMaxSplits, ...)
};

CpLayout make_layout(int32_t num_ranks, const AttnArgs& args, int32_t splits_per_rank, bool has_edge);

// The SplitKWorkspace of a rank's split-K pass inside its record block.
inline SplitKWorkspace rank_splitk_workspace(const CpLayout& L, float* rank_block) {
  return SplitKWorkspace{rank_block, L.splitk_floats() * sizeof(float), L.splits_per_rank};
}

// ---- Query runs (docs/context_parallel.md 7): a prompt or chunk over a
// sharded context. With contiguous sharding a rank holds the positions of
// its pages, [kv_start, kv_start + kv_lens), as a shard view
// (AttnArgs::kv_start / kv_lens): every rank attends the whole run
// over its view (the causal rule and the window stay global, so no edge
// pass), and the records merge as the decode's do, query rows in the place
// of sequences (run_layout). The CPU backend serves shard views today.
struct RunShard {
  int32_t rank = 0;
  int32_t num_seqs = 0;
  int32_t max_blocks_per_seq = 1;     // row width of block_tables (>= 1)
  std::vector<int32_t> block_tables;  // [num_seqs, max_blocks_per_seq]: the rank's pages from entry 0; unused -1
  std::vector<int32_t> kv_start;      // [num_seqs] first global position of the rank's pages (0 when none)
  std::vector<int32_t> kv_lens;       // [num_seqs] positions the rank holds
};

// Rank `rank`'s view of each sequence (spec.kind must be contiguous: an
// interleaved shard is not one range of positions; Unsupported).
RunShard make_run_shard(const ShardSpec& spec, int32_t rank, const int32_t* block_tables, int32_t max_blocks_per_seq,
                        const int32_t* seq_lens, int32_t num_seqs, int32_t block_size);

// The rank's AttnArgs: `global` (q, q_start, heads, the window, the
// RANK'S cache view, out) with the shard's tables and view (pointers to
// the copies in the rank's memory).
AttnArgs rank_attn_args(const AttnArgs& global, const RunShard& shard, const int32_t* block_tables,
                             const int32_t* kv_start, const int32_t* kv_lens);

// The exchange's layout for query runs: CpLayout with one "sequence" per
// query row, no edge records.
CpLayout run_layout(int32_t num_ranks, const AttnArgs& args, int32_t splits_per_rank);

}  // namespace metrale::cp

namespace metrale::cpu {

// Rank step 1: the split-K pass of `rank_args` (from rank_attn_args) into
// the first part of `rank_block` (L.rank_floats() floats) and, when
// L.has_edge, the edge pass over `edges` (host, [num_seqs]) into the rest.
void cp_rank_states(const cp::CpLayout& L, const AttnArgs& rank_args, const cp::EdgeSlice* edges,
                    float* rank_block);
// Only the edge pass: S*H records at `edge_records`.
void cp_edge_states(const AttnArgs& rank_args, const cp::EdgeSlice* edges, float* edge_records);
// Step 3 (after the gather): permutes `gathered` (L.gathered_floats(), rank
// major) into `merged` (L.merged_floats()) and reduces into `out`
// ([num_seqs, num_q_heads, head_dim] bf16).
void cp_merge(const cp::CpLayout& L, const float* gathered, float* merged, bf16* out);

}  // namespace metrale::cpu

namespace metrale::cuda {

// The same on device memory, enqueued on `stream`; `edges` is a device array.
void cp_rank_states(const cp::CpLayout& L, const AttnArgs& rank_args, const cp::EdgeSlice* edges,
                    float* rank_block, Stream stream = nullptr);
void cp_edge_states(const AttnArgs& rank_args, const cp::EdgeSlice* edges, float* edge_records,
                    Stream stream = nullptr);
void cp_merge(const cp::CpLayout& L, const float* gathered, float* merged, bf16* out, Stream stream = nullptr);

}  // namespace metrale::cuda

// ---- NCCL exchange: link metrale::nccl (target metrale_nccl) ----
namespace metrale::nccl {

// In-place all-gather of the rank blocks: rank `rank` has written its block
// at gathered + rank * L.rank_floats(); afterwards every rank holds all R.
// `comm` is the caller's communicator (R = its size, `rank` its rank).
void cp_all_gather(const cp::CpLayout& L, int32_t rank, float* gathered, ncclComm* comm,
                   cuda::Stream stream = nullptr);

// One whole context-parallel decode step on this rank: states -> all-gather ->
// merge into rank_args.out. `gathered` and `merged` are device buffers of
// L.gathered_floats() / L.merged_floats(); `edges` a device array (may be
// null when !L.has_edge).
void cp_decode(const cp::CpLayout& L, int32_t rank, const AttnArgs& rank_args, const cp::EdgeSlice* edges,
               float* gathered, float* merged, ncclComm* comm, cuda::Stream stream = nullptr);

}  // namespace metrale::nccl
