// The attention bindings of _metrale: the plan (AttnPlan, plan_attention),
// one attention call for every query shape (decode: q_start None, one row
// per sequence; query runs through q_start; sinks, soft-cap, lse), the
// reduce of split-K states computed elsewhere, the block-table check.
// Arrays are checked here (dtype, shape, strides, device) before the C++
// validation of the values; nothing is allocated.

#include <nanobind/nanobind.h>

#include "ext_common.hpp"

namespace metrale_ext {
namespace {

AttnPlan plan_for(int32_t num_seqs, int32_t num_q_heads, const KvCacheLayout& layout, int32_t max_seq_len,
                  int32_t sliding_window, int32_t device, int32_t max_q_len, int32_t num_q_rows, bool attn_options,
                  bool query_runs, int32_t num_splits, const std::string& merge, size_t max_workspace_bytes) {
  AttnProblem p;
  p.num_seqs = num_seqs;
  p.num_q_heads = num_q_heads;
  p.layout = layout;
  p.max_seq_len = max_seq_len;
  p.sliding_window = sliding_window;
  p.max_q_len = max_q_len;
  p.num_q_rows = num_q_rows;
  p.attn_options = attn_options;
  p.query_runs = query_runs;
  AttnPlanOptions o;
  o.num_splits = num_splits;
  o.merge = split_merge_from_string(merge);  // InvalidArgument -> ValueError
  o.max_workspace_bytes = max_workspace_bytes;
  if (device < 0) return plan_attention(p, cpu::attention_target(), o);
  DeviceGuard g(Where{Dev::cuda, device});
  return plan_attention(p, cuda::attention_target(), o);
}

// The split-K workspace of a plan that writes one (workspace, states_only merges).
SplitKWorkspace bind_workspace(const std::optional<Out>& workspace, int32_t num_splits, const char* why) {
  if (!workspace) value_error("'workspace': required (", why, ")");
  check_dtype(*workspace, "workspace", nb::dlpack::dtype_code::Float, 32, "float32");
  check_contiguous(*workspace, "workspace");
  SplitKWorkspace ws;
  ws.num_splits = num_splits;
  ws.data = static_cast<float*>(workspace->data());
  ws.bytes = size_t(nbytes(*workspace));
  return ws;
}

template <class A>
const float* bind_sinks(const std::optional<A>& sinks, int64_t num_q_heads) {
  if (!sinks) return nullptr;
  check_dtype(*sinks, "sinks", nb::dlpack::dtype_code::Float, 32, "float32");
  if (sinks->ndim() != 1 || int64_t(sinks->shape(0)) != num_q_heads || !c_contiguous(*sinks))
    value_error("'sinks': expected a contiguous float32 array of shape (", num_q_heads, ",), got shape ",
                shape_str(*sinks));
  return static_cast<const float*>(sinks->data());
}

float* bind_lse(const std::optional<Out>& lse, int64_t rows, int64_t num_q_heads) {
  if (!lse) return nullptr;
  check_dtype(*lse, "lse", nb::dlpack::dtype_code::Float, 32, "float32");
  check_contiguous(*lse, "lse");
  if (nbytes(*lse) != rows * num_q_heads * 4)
    value_error("'lse': expected ", rows, " x ", num_q_heads, " float32 (rows, num_q_heads), got shape ",
                shape_str(*lse));
  return static_cast<float*>(lse->data());
}

// Attention of every query shape with `plan`. `out` may be None for a
// states_only plan (the run writes the split-K states only).
void attention(const AttnPlan& plan, const In& q, const KvCacheLayout& layout, const In& k_cache, const In& v_cache,
               const ScalesTuple& scales, std::optional<In> q_start, const In& block_tables, const In& seq_lens,
               int32_t sliding_window, float sm_scale, std::optional<In> sinks, float softcap,
               std::optional<Out> out, std::optional<Out> lse, std::optional<Out> workspace, uintptr_t stream) {
  layout.validate();
  const int32_t num_q_heads = plan.problem.num_q_heads;
  DeviceCheck dc;
  dc.add(q, "q");
  dc.add(k_cache, "k_cache");
  dc.add(v_cache, "v_cache");
  if (q_start) dc.add(*q_start, "q_start");
  dc.add(block_tables, "block_tables");
  dc.add(seq_lens, "seq_lens");
  if (out) dc.add(*out, "out");
  if (sinks) dc.add(*sinks, "sinks");
  if (lse) dc.add(*lse, "lse");
  if (workspace) dc.add(*workspace, "workspace");
  const int64_t D = layout.head_dim;
  if (num_q_heads % layout.num_kv_heads != 0)
    value_error("'num_q_heads' = ", num_q_heads, "; expected a positive multiple of the cache's num_kv_heads = ",
                layout.num_kv_heads, " (GQA: num_q_heads % num_kv_heads == 0)");
  const Rows qr = bf16_rows(q, "q", num_q_heads, D);
  int64_t num_seqs = qr.num_rows;  // decode: one row per sequence
  if (q_start) {
    if (block_tables.ndim() != 2)
      value_error("'block_tables': expected shape (num_seqs, max_blocks_per_seq), got shape ", shape_str(block_tables));
    num_seqs = int64_t(block_tables.shape(0));
    check_dtype(*q_start, "q_start", nb::dlpack::dtype_code::Int, 32, "int32");
    if (q_start->ndim() != 1 || int64_t(q_start->shape(0)) != num_seqs + 1 || !c_contiguous(*q_start))
      value_error("'q_start': expected a contiguous int32 array of shape (num_seqs + 1 = ", num_seqs + 1,
                  ",), num_seqs being block_tables' rows, got shape ", shape_str(*q_start));
  }
  check_tables(block_tables, seq_lens, num_seqs);
  const bool states_only = plan.merge == SplitMerge::states_only;
  AttnArgs a;
  if (out) {
    check_out_rows(*out, "out", num_q_heads, D, qr.num_rows);
    a.out = static_cast<bf16*>(out->data());
  } else if (!states_only) {
    value_error("'out': required (the plan merges into it: merge = ", to_string(plan.merge), ")");
  }
  a.q = static_cast<const bf16*>(qr.ptr);
  a.q_stride = qr.stride;
  a.q_head_stride = qr.head_stride;
  a.q_start = q_start ? static_cast<const int32_t*>(q_start->data()) : nullptr;
  a.num_seqs = int32_t(num_seqs);
  a.num_q_rows = int32_t(qr.num_rows);
  a.num_q_heads = num_q_heads;
  a.cache = make_view(layout, k_cache, v_cache, scales);
  a.block_tables = static_cast<const int32_t*>(block_tables.data());
  a.max_blocks_per_seq = int32_t(block_tables.shape(1));
  a.seq_lens = static_cast<const int32_t*>(seq_lens.data());
  a.sliding_window = sliding_window;
  a.sm_scale = sm_scale;
  a.softcap = softcap;
  a.sinks = bind_sinks(sinks, num_q_heads);
  a.lse = bind_lse(lse, qr.num_rows, num_q_heads);
  SplitKWorkspace ws;
  if (plan.workspace_bytes > 0)
    ws = bind_workspace(workspace, plan.num_splits,
                        concat("the plan needs ", plan.workspace_bytes, " bytes of it: merge = ", to_string(plan.merge),
                               " of ", plan.num_splits, " splits",
                               plan.launch.stage_kv ? ", and the prefill's staged bf16 pages" : "")
                            .c_str());
  if (dc.w.dev == Dev::cpu) {
    nb::gil_scoped_release nogil;
    cpu::run_attention(plan, a, ws);
    return;
  }
  DeviceGuard g(dc.w);
  cuda::run_attention(plan, a, ws, as_stream(stream));
}

void reduce_states(const In& workspace, int32_t num_q_heads, int32_t head_dim, int32_t num_splits, const Out& out,
                   std::optional<In> sinks, std::optional<Out> lse, uintptr_t stream) {
  DeviceCheck dc;
  dc.add(workspace, "workspace");
  dc.add(out, "out");
  if (sinks) dc.add(*sinks, "sinks");
  if (lse) dc.add(*lse, "lse");
  check_dtype(workspace, "workspace", nb::dlpack::dtype_code::Float, 32, "float32");
  check_contiguous(workspace, "workspace");
  if (out.ndim() < 1) value_error("'out': expected shape (rows, ", num_q_heads, ", ", head_dim, ")");
  const int64_t rows = out.shape(0);
  check_out_rows(out, "out", num_q_heads, head_dim, rows);
  ReduceArgs r;
  r.workspace = static_cast<const float*>(workspace.data());
  r.workspace_bytes = size_t(nbytes(workspace));
  r.num_seqs = int32_t(rows);
  r.num_q_heads = num_q_heads;
  r.head_dim = head_dim;
  r.num_splits = num_splits;
  r.out = static_cast<bf16*>(out.data());
  r.sinks = bind_sinks(sinks, num_q_heads);
  r.lse = bind_lse(lse, rows, num_q_heads);
  if (dc.w.dev == Dev::cpu) {
    nb::gil_scoped_release nogil;
    cpu::reduce_states(r);
    return;
  }
  DeviceGuard g(dc.w);
  cuda::reduce_states(r, as_stream(stream));
}

void validate_tables(const KvCacheLayout& layout, const In& block_tables, const In& seq_lens, int32_t sliding_window) {
  if (where_of(block_tables, "block_tables").dev != Dev::cpu || where_of(seq_lens, "seq_lens").dev != Dev::cpu)
    value_error("validate_block_tables: expected host (CPU) copies of 'block_tables' and 'seq_lens'");
  check_dtype(block_tables, "block_tables", nb::dlpack::dtype_code::Int, 32, "int32");
  check_dtype(seq_lens, "seq_lens", nb::dlpack::dtype_code::Int, 32, "int32");
  check_contiguous(block_tables, "block_tables");
  check_contiguous(seq_lens, "seq_lens");
  if (block_tables.ndim() != 2 || seq_lens.ndim() != 1 || block_tables.shape(0) != seq_lens.shape(0))
    value_error("'block_tables' / 'seq_lens': expected shapes (num_seqs, max_blocks_per_seq) and (num_seqs,), got ",
                shape_str(block_tables), " and ", shape_str(seq_lens));
  if (seq_lens.shape(0) == 0) return;
  validate_block_tables(layout, static_cast<const int32_t*>(block_tables.data()), int32_t(block_tables.shape(1)),
                        static_cast<const int32_t*>(seq_lens.data()), int32_t(seq_lens.shape(0)), sliding_window);
}

std::string plan_repr(const AttnPlan& p) {
  return concat("AttnPlan(kernel=", to_string(p.kernel), ", num_splits=", p.num_splits, ", merge=",
                to_string(p.merge), ", workspace_bytes=", p.workspace_bytes, ", num_seqs=", p.problem.num_seqs,
                ", rows=", p.problem.rows(), ", max_q_len=", p.problem.max_q_len, ")");
}

}  // namespace

void bind_attention(nb::module_& m) {
  nb::class_<AttnPlan>(m, "AttnPlan")
      .def_prop_ro("kernel", [](const AttnPlan& p) { return std::string(to_string(p.kernel)); })
      .def_ro("num_splits", &AttnPlan::num_splits)
      .def_prop_ro("merge", [](const AttnPlan& p) { return std::string(to_string(p.merge)); })
      .def_ro("workspace_bytes", &AttnPlan::workspace_bytes)
      .def_prop_ro("grid",
                   [](const AttnPlan& p) { return std::make_tuple(p.grid_x(p.problem.num_seqs), p.num_splits); })
      .def_prop_ro("num_seqs", [](const AttnPlan& p) { return p.problem.num_seqs; })
      .def_prop_ro("num_q_heads", [](const AttnPlan& p) { return p.problem.num_q_heads; })
      .def_prop_ro("layout", [](const AttnPlan& p) { return p.problem.layout; })
      .def_prop_ro("max_seq_len", [](const AttnPlan& p) { return p.problem.max_seq_len; })
      .def_prop_ro("sliding_window", [](const AttnPlan& p) { return p.problem.sliding_window; })
      .def_prop_ro("max_q_len", [](const AttnPlan& p) { return p.problem.max_q_len; })
      .def_prop_ro("num_q_rows", [](const AttnPlan& p) { return p.problem.rows(); })
      .def_prop_ro("attn_options", [](const AttnPlan& p) { return p.problem.attn_options; })
      .def_prop_ro("query_runs", [](const AttnPlan& p) { return p.problem.query_runs; })
      .def("__repr__", &plan_repr);

  // device < 0: the CPU backend's target; else CUDA device `device`.
  m.def("plan_attention", &plan_for, nb::arg("num_seqs"), nb::arg("num_q_heads"), nb::arg("layout"),
        nb::arg("max_seq_len"), nb::arg("sliding_window"), nb::arg("device"), nb::arg("max_q_len"),
        nb::arg("num_q_rows"), nb::arg("attn_options"), nb::arg("query_runs"), nb::arg("num_splits"),
        nb::arg("merge"), nb::arg("max_workspace_bytes"));
  m.def("default_max_workspace_bytes", []() { return kDefaultMaxWorkspaceBytes; });
  m.def("attention", &attention, nb::arg("plan"), nb::arg("q"), nb::arg("layout"), nb::arg("k_cache"),
        nb::arg("v_cache"), nb::arg("scales"), nb::arg("q_start").none(), nb::arg("block_tables"),
        nb::arg("seq_lens"), nb::arg("sliding_window"), nb::arg("sm_scale"), nb::arg("sinks").none(),
        nb::arg("softcap"), nb::arg("out").none(), nb::arg("lse").none(), nb::arg("workspace").none(),
        nb::arg("stream"));
  m.def("reduce_states", &reduce_states, nb::arg("workspace"), nb::arg("num_q_heads"), nb::arg("head_dim"),
        nb::arg("num_splits"), nb::arg("out"), nb::arg("sinks").none(), nb::arg("lse").none(), nb::arg("stream"));
  m.def("validate_block_tables", &validate_tables, nb::arg("layout"), nb::arg("block_tables"), nb::arg("seq_lens"),
        nb::arg("sliding_window"));
}

}  // namespace metrale_ext
