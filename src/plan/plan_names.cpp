// The plan's vocabulary: names of its enums (benchmark flags, Python), the
// problem of a call's arguments, the kernel id of a plan, the workspace size.
#include <algorithm>
#include <climits>
#include <initializer_list>
#include <string>

#include "metrale/error.hpp"
#include "metrale/plan.hpp"
#include "plan/tuning.hpp"

namespace metrale {

size_t splitk_workspace_bytes(int64_t num_rows, int32_t num_q_heads, int32_t head_dim, int32_t num_splits) {
  return size_t(num_rows) * size_t(num_q_heads) * size_t(num_splits) * size_t(head_dim + 2) * sizeof(float);
}

const char* to_string(AttnKernel k) {
  switch (k) {
    case AttnKernel::decode: return "decode";
    case AttnKernel::query_runs: return "query_runs";
    case AttnKernel::prefill: return "prefill";
  }
  return "unknown";
}

const char* to_string(SplitMerge m) {
  switch (m) {
    case SplitMerge::automatic: return "automatic";
    case SplitMerge::single_pass: return "single_pass";
    case SplitMerge::cluster: return "cluster";
    case SplitMerge::workspace: return "workspace";
    case SplitMerge::states_only: return "states_only";
  }
  return "unknown";
}

namespace detail {
const char* to_string(LoadPath p) {
  switch (p) {
    case LoadPath::automatic: return "automatic";
    case LoadPath::registers: return "registers";
    case LoadPath::tma: return "tma";
  }
  return "unknown";
}

const char* to_string(Toggle t) {
  switch (t) {
    case Toggle::automatic: return "automatic";
    case Toggle::off: return "off";
    case Toggle::on: return "on";
  }
  return "unknown";
}
}  // namespace detail

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

SplitMerge split_merge_from_string(const std::string& name, const char* arg) {
  return from_string(name, arg,
                     {SplitMerge::automatic, SplitMerge::single_pass, SplitMerge::cluster, SplitMerge::workspace,
                      SplitMerge::states_only});
}
detail::LoadPath detail::load_path_from_string(const std::string& name, const char* arg) {
  return from_string(name, arg, {LoadPath::automatic, LoadPath::registers, LoadPath::tma});
}
detail::Toggle detail::toggle_from_string(const std::string& name, const char* arg) {
  return from_string(name, arg, {Toggle::automatic, Toggle::off, Toggle::on});
}

AttnProblem attention_problem(const AttnArgs& a, int32_t max_seq_len, int32_t max_q_len) {
  const int32_t capacity =
      int32_t(std::min<int64_t>(int64_t(a.max_blocks_per_seq) * a.cache.layout.block_size, INT32_MAX));
  AttnProblem p;
  p.num_seqs = a.num_seqs;
  p.num_q_heads = a.num_q_heads;
  p.layout = a.cache.layout;
  p.max_seq_len = max_seq_len >= 0 ? max_seq_len : capacity;
  p.sliding_window = a.sliding_window;
  p.max_q_len = a.q_start == nullptr ? 1 : (max_q_len > 0 ? max_q_len : std::max(capacity, 1));
  p.num_q_rows = a.rows();
  p.attn_options = a.has_options();
  p.query_runs = a.q_start != nullptr;
  return p;
}

detail::KernelId AttnPlan::kernel_id() const {
  const detail::KernelLaunch& l = launch;
  return detail::KernelId{l.stage_kv ? KvFormat::bf16 : problem.layout.format,
                          l.pair_kv_heads ? 2 * problem.layout.head_dim : problem.layout.head_dim,
                          l.load_path,
                          l.pair_kv_heads,
                          kernel != AttnKernel::decode,
                          l.col_tiles,
                          l.head_dim_parts,
                          kernel == AttnKernel::prefill,
                          l.tile_pairs};
}

}  // namespace metrale
