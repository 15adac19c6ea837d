// Bad input (docs/spec.md 6): every entry point of the CPU backend, the layout,
// the planner and the debug block-table validator reject malformed arguments
// with a typed error (InvalidArgument, or Unsupported for configurations
// that are not built) whose message names the argument, before touching any
// output.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "testing/forced_plans.hpp"
#include "metrale/cpu.hpp"
#include "metrale/error.hpp"
#include "metrale/plan.hpp"
#include "support/problem.hpp"

namespace metrale::test {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Runs f, which must throw InvalidArgument (not its subclass Unsupported)
// whose what() names the argument and says what was expected.
void expect_invalid(const std::function<void()>& f, const std::string& name, const std::string& what) {
  SCOPED_TRACE(what);
  try {
    f();
    ADD_FAILURE() << "no exception; expected one naming '" << name << "'";
  } catch (const Unsupported& e) {
    ADD_FAILURE() << "Unsupported where InvalidArgument was expected: " << e.what();
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(name), std::string::npos) << "message does not name '" << name << "': " << msg;
    EXPECT_NE(msg.find("expected"), std::string::npos) << "message does not say what was expected: " << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}
void expect_unsupported(const std::function<void()>& f, const std::string& name, const std::string& what) {
  SCOPED_TRACE(what);
  try {
    f();
    ADD_FAILURE() << "no exception; expected Unsupported naming '" << name << "'";
  } catch (const Unsupported& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(name), std::string::npos) << msg;
    EXPECT_NE(msg.find("supported"), std::string::npos) << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type (want Unsupported): " << e.what();
  }
}

template <class T>
T* misalign(T* p) {
  return reinterpret_cast<T*>(reinterpret_cast<uint8_t*>(p) + 2);
}
template <class T>
const T* misalign(const T* p) {
  return reinterpret_cast<const T*>(reinterpret_cast<const uint8_t*>(p) + 2);
}

// A valid decode call with its output, split-K workspace and the knobs to break it.
struct DecodeFixture {
  HostProblem p;
  std::vector<bf16> out;
  std::vector<float> ws;
  static constexpr int32_t kSplits = 3;

  explicit DecodeFixture(KvFormat f) {
    DecodeCase c;
    c.format = f;
    c.head_dim = 64;
    c.seq_lens = {20, 0, 33};
    p = make_problem(c, 11);
    out = poisoned_bf16(p.out_elems());
    ws.assign(splitk_workspace_bytes(p.num_seqs(), p.num_q_heads(), 64, kSplits) / 4 + 16, 0.0f);
  }
  AttnArgs args() { return p.args(out.data()); }
  SplitKWorkspace workspace() { return SplitKWorkspace{ws.data(), ws.size() * sizeof(float), kSplits}; }
  ReduceArgs reduce_args() {
    ReduceArgs r;
    r.workspace = ws.data();
    r.workspace_bytes = ws.size() * sizeof(float);
    r.num_seqs = p.num_seqs();
    r.num_q_heads = p.num_q_heads();
    r.head_dim = 64;
    r.num_splits = kSplits;
    r.out = out.data();
    return r;
  }
  bool output_untouched() const { return count_poison(out.data(), out.size()) == int64_t(out.size()); }
};

// Checks `mutate` breaks the decode entry points (single pass, split-K pass
// unless `split_pass_unaffected`, run_attention) with the expected error, and
// that no output was written.
void expect_decode_invalid(KvFormat f, const std::function<void(AttnArgs&)>& mutate, const std::string& name,
                           const std::string& what, bool unsupported = false, bool split_pass_unaffected = false) {
  DecodeFixture fx(f);
  AttnArgs a = fx.args();
  mutate(a);
  const SplitKWorkspace ws = fx.workspace();
  auto single = [&] { test::cpu_single_pass(a); };
  auto split = [&] { test::cpu_split_states(a, ws); };
  test::PlanChoices two;
  two.num_splits = 2;
  const AttnPlan plan = test::plan_with(attention_problem(fx.args()), cpu::attention_target(), two);
  auto run = [&] { cpu::run_attention(plan, a, ws); };
  std::vector<std::function<void()>> calls{single, run};
  if (!split_pass_unaffected) calls.push_back(split);
  for (const auto& call : calls) {
    if (unsupported) expect_unsupported(call, name, what);
    else expect_invalid(call, name, what);
  }
  EXPECT_TRUE(fx.output_untouched()) << what << ": output written despite the error";
}

TEST(Validation, DecodePointers) {
  expect_decode_invalid(KvFormat::bf16, [](AttnArgs& a) { a.q = nullptr; }, "q", "null q");
  expect_decode_invalid(KvFormat::bf16, [](AttnArgs& a) { a.q = misalign(a.q); }, "q", "misaligned q");
  // The split-K pass writes only the workspace, so it does not need `out`.
  expect_decode_invalid(KvFormat::bf16, [](AttnArgs& a) { a.out = nullptr; }, "out", "null out", false, true);
  expect_decode_invalid(KvFormat::bf16, [](AttnArgs& a) { a.out = misalign(a.out); }, "out", "misaligned out",
                        false, true);
  {
    DecodeFixture fx(KvFormat::bf16);
    AttnArgs a = fx.args();
    a.out = nullptr;
    EXPECT_NO_THROW(test::cpu_split_states(a, fx.workspace()));
  }
  expect_decode_invalid(KvFormat::fp8_e4m3, [](AttnArgs& a) { a.cache.k = nullptr; }, "cache.k", "null cache.k");
  expect_decode_invalid(KvFormat::fp8_e4m3, [](AttnArgs& a) { a.cache.k = misalign(a.cache.k); }, "cache.k",
                        "misaligned cache.k");
  expect_decode_invalid(KvFormat::nvfp4, [](AttnArgs& a) { a.cache.v = nullptr; }, "cache.v", "null cache.v");
  expect_decode_invalid(KvFormat::nvfp4, [](AttnArgs& a) { a.cache.v = misalign(a.cache.v); }, "cache.v",
                        "misaligned cache.v");
  expect_decode_invalid(KvFormat::bf16, [](AttnArgs& a) { a.block_tables = nullptr; }, "block_tables",
                        "null block_tables");
  expect_decode_invalid(KvFormat::bf16, [](AttnArgs& a) { a.seq_lens = nullptr; }, "seq_lens", "null seq_lens");
}

TEST(Validation, DecodeUnsupportedShapes) {
  for (KvFormat f : {KvFormat::bf16, KvFormat::fp8_e4m3, KvFormat::nvfp4}) {
    for (int32_t d : {0, 32, 96, 512})
      expect_decode_invalid(f, [d](AttnArgs& a) { a.cache.layout.head_dim = d; }, "head_dim",
                            "head_dim " + std::to_string(d), true);
    for (int32_t b : {0, 8, 24, 256})
      expect_decode_invalid(f, [b](AttnArgs& a) { a.cache.layout.block_size = b; }, "block_size",
                            "block_size " + std::to_string(b), true);
  }
}

TEST(Validation, DecodeShapesAndStrides) {
  const KvFormat f = KvFormat::bf16;
  expect_decode_invalid(f, [](AttnArgs& a) { a.num_q_heads = a.cache.layout.num_kv_heads * 4 + 1; }, "num_q_heads",
                        "num_q_heads not a multiple of num_kv_heads");
  expect_decode_invalid(f, [](AttnArgs& a) { a.num_q_heads = 0; }, "num_q_heads", "num_q_heads 0");
  expect_decode_invalid(f, [](AttnArgs& a) { a.num_seqs = -1; }, "num_seqs", "negative num_seqs");
  expect_decode_invalid(f, [](AttnArgs& a) { a.q_stride = int64_t(a.num_q_heads) * 64 - 8; }, "q_stride",
                        "q_stride too small");
  expect_decode_invalid(f, [](AttnArgs& a) { a.q_stride += 4; }, "q_stride", "q_stride not a multiple of 8");
  expect_decode_invalid(f, [](AttnArgs& a) { a.sliding_window = -1; }, "sliding_window", "negative window");
  expect_decode_invalid(f, [](AttnArgs& a) { a.sm_scale = kNaN; }, "sm_scale", "NaN sm_scale");
  expect_decode_invalid(f, [](AttnArgs& a) { a.max_blocks_per_seq = 0; }, "max_blocks_per_seq",
                        "max_blocks_per_seq 0");
  expect_decode_invalid(f, [](AttnArgs& a) { a.cache.layout.num_kv_heads = 0; }, "num_kv_heads", "0 kv heads");
  expect_decode_invalid(f, [](AttnArgs& a) { a.cache.layout.num_blocks = 0; }, "num_blocks", "0 blocks");
}

// A q stride along an extent of one, or over no rows at all, is never
// followed: an empty batch of runs with any head stride, and one row of one
// head with any row and head strides (multiples of 8), are valid calls.
TEST(Validation, QStridesOfUnitOrEmptyExtentsAreNotChecked) {
  DecodeFixture fx(KvFormat::bf16);
  const std::vector<int32_t> empty_runs(size_t(fx.p.num_seqs()) + 1, 0);
  AttnArgs a = fx.args();
  a.q_start = empty_runs.data();
  a.num_q_rows = 0;
  a.q_stride = 72;
  a.q_head_stride = 8;  // q_layout of head-major q over no rows
  EXPECT_NO_THROW(test::cpu_single_pass(a));
  EXPECT_TRUE(fx.output_untouched());

  DecodeCase c;
  c.head_dim = 64;
  c.num_kv_heads = 1;
  c.group = 1;
  c.seq_lens = {20};
  HostProblem one = make_problem(c, 5);
  std::vector<bf16> out = poisoned_bf16(one.out_elems());
  AttnArgs b = one.args(out.data());
  std::vector<bf16> q(64);
  for (size_t i = 0; i < q.size(); ++i) q[i] = one.q[i];
  b.q = q.data();
  b.q_stride = 8;
  b.q_head_stride = 16;
  EXPECT_NO_THROW(test::cpu_single_pass(b));
  const AttnArgs packed = one.args(out.data());
  std::vector<bf16> ref = poisoned_bf16(one.out_elems());
  AttnArgs pr = packed;
  pr.out = ref.data();
  test::cpu_single_pass(pr);
  EXPECT_EQ(0, std::memcmp(out.data(), ref.data(), out.size() * sizeof(bf16)));
}

TEST(Validation, CacheSectionsAndPageStrides) {
  for (KvFormat f : {KvFormat::bf16, KvFormat::fp8_e4m3, KvFormat::nvfp4}) {
    expect_decode_invalid(f, [](AttnArgs& a) { a.cache.layout.page_stride_bytes = a.cache.layout.data_section_bytes - 16; },
                          "page_stride_bytes", "page stride smaller than the payload");
    expect_decode_invalid(f, [](AttnArgs& a) { a.cache.layout.page_stride_bytes += 8; }, "page_stride_bytes",
                          "page stride not a multiple of 16");
    expect_decode_invalid(f, [](AttnArgs& a) { a.cache.layout.data_section_bytes -= 16; }, "data_section_bytes",
                          "data section too small");
  }
  expect_decode_invalid(KvFormat::nvfp4, [](AttnArgs& a) { a.cache.layout.data_section_bytes += 8; },
                        "data_section_bytes", "nvfp4 data section not a multiple of 16");
  expect_decode_invalid(KvFormat::nvfp4, [](AttnArgs& a) { a.cache.layout.data_section_bytes += 16; },
                        "page_stride_bytes", "nvfp4 scale section past the page");
  expect_decode_invalid(KvFormat::fp8_e4m3, [](AttnArgs& a) { a.cache.layout.data_section_bytes += 16; },
                        "data_section_bytes", "fp8 data section must equal the payload");
  // The layout factories validate too.
  expect_unsupported([] { KvCacheLayout::bf16(10, 16, 2, 96); }, "head_dim", "factory head_dim 96");
  expect_unsupported([] { KvCacheLayout::fp8(10, 24, 2, 64); }, "block_size", "factory block_size 24");
  expect_invalid([] { KvCacheLayout::fp8(10, 16, 2, 64, 16 * 2 * 64 - 16); }, "page_stride_bytes",
                 "fp8 cache_stride too small");
  expect_invalid([] { KvCacheLayout::fp8(10, 16, 2, 64, 16 * 2 * 64 + 4); }, "page_stride_bytes",
                 "fp8 cache_stride not a multiple of 16");
  expect_invalid([] { KvCacheLayout::nvfp4(10, 16, 2, 64, 0, 16 * 2 * 32 - 16); }, "data_section_bytes",
                 "nvfp4 data_section_bytes too small");
  expect_invalid([] { KvCacheLayout::nvfp4(10, 16, 2, 64, 16 * 2 * 32 + 16 * 2 * 4 - 16, 0); }, "page_stride_bytes",
                 "nvfp4 block_stride_bytes too small");
}

TEST(Validation, Scales) {
  for (float bad : {0.0f, -1.0f, kInf, -kInf, kNaN}) {
    const std::string v = std::to_string(bad);
    expect_decode_invalid(KvFormat::fp8_e4m3, [bad](AttnArgs& a) { a.cache.scales.k_scale = bad; }, "k_scale",
                          "fp8 k_scale " + v);
    expect_decode_invalid(KvFormat::fp8_e4m3, [bad](AttnArgs& a) { a.cache.scales.v_scale = bad; }, "v_scale",
                          "fp8 v_scale " + v);
    expect_decode_invalid(KvFormat::nvfp4, [bad](AttnArgs& a) { a.cache.scales.k_global_scale = bad; },
                          "k_global_scale", "nvfp4 k_global_scale " + v);
    expect_decode_invalid(KvFormat::nvfp4, [bad](AttnArgs& a) { a.cache.scales.v_global_scale = bad; },
                          "v_global_scale", "nvfp4 v_global_scale " + v);
  }
  // FP8: a subnormal scale would give the write an infinite 1 / scale; the smallest normal f32 is taken.
  for (float bad : {1e-39f, std::nextafter(0x1p-126f, 0.0f)}) {
    expect_decode_invalid(KvFormat::fp8_e4m3, [bad](AttnArgs& a) { a.cache.scales.k_scale = bad; }, "k_scale",
                          "fp8 subnormal k_scale");
    expect_decode_invalid(KvFormat::fp8_e4m3, [bad](AttnArgs& a) { a.cache.scales.v_scale = bad; }, "v_scale",
                          "fp8 subnormal v_scale");
  }
}

TEST(Validation, SplitKWorkspace) {
  DecodeFixture fx(KvFormat::bf16);
  const AttnArgs a = fx.args();
  SplitKWorkspace ws = fx.workspace();
  auto splitk = [&](SplitKWorkspace w) { return [&a, w] { test::cpu_split_states(a, w); }; };
  ws.data = nullptr;
  expect_invalid(splitk(ws), "workspace", "null workspace");
  ws = fx.workspace();
  ws.data = misalign(ws.data);
  expect_invalid(splitk(ws), "workspace", "misaligned workspace");
  ws = fx.workspace();
  ws.bytes = splitk_workspace_bytes(a.num_seqs, a.num_q_heads, 64, ws.num_splits) - 4;
  expect_invalid(splitk(ws), "workspace_bytes", "workspace too small");
  for (int32_t n : {0, -1, kMaxSplits + 1}) {
    ws = fx.workspace();
    ws.num_splits = n;
    expect_invalid(splitk(ws), "num_splits", "num_splits " + std::to_string(n));
  }
  // A plan the workspace cannot hold, and a malformed plan.
  test::PlanChoices many;
  many.num_splits = 200;
  const AttnPlan big = test::plan_with(attention_problem(a), cpu::attention_target(), many);
  expect_invalid([&] { cpu::run_attention(big, a, fx.workspace()); }, "workspace_bytes",
                 "run_attention: workspace too small for the plan");
  AttnPlan malformed = plan_attention(attention_problem(a), cpu::attention_target());
  malformed.num_splits = 0;
  expect_invalid([&] { cpu::run_attention(malformed, a, fx.workspace()); }, "num_splits",
                 "run_attention: plan num_splits 0");
  // A plan made for other heads, another layout or fewer sequences.
  AttnProblem other = attention_problem(a);
  other.num_q_heads *= 2;
  expect_invalid([&] { cpu::run_attention(plan_attention(other, cpu::attention_target()), a, fx.workspace()); },
                 "num_q_heads", "run_attention: plan for other q heads");
  other = attention_problem(a);
  other.layout = KvCacheLayout::bf16(a.cache.layout.num_blocks, a.cache.layout.block_size,
                                     a.cache.layout.num_kv_heads, 2 * a.cache.layout.head_dim);
  expect_invalid([&] { cpu::run_attention(plan_attention(other, cpu::attention_target()), a, fx.workspace()); }, "plan",
                 "run_attention: plan for another layout");
  other = attention_problem(a);
  other.num_seqs = a.num_seqs - 1;
  expect_invalid([&] { cpu::run_attention(plan_attention(other, cpu::attention_target()), a, fx.workspace()); },
                 "num_seqs", "run_attention: plan for fewer sequences");
  // The workspace laid out for another split count than the plan's.
  SplitKWorkspace mislaid = fx.workspace();
  mislaid.num_splits = 1;
  test::PlanChoices three;
  three.num_splits = 3;
  expect_invalid([&] { cpu::run_attention(test::plan_with(attention_problem(a), cpu::attention_target(), three), a, mislaid); },
                 "workspace.num_splits", "run_attention: workspace of another split count");
  EXPECT_TRUE(fx.output_untouched());
}

TEST(Validation, Reduce) {
  DecodeFixture fx(KvFormat::bf16);
  auto reduce = [](ReduceArgs r) { return [r] { cpu::reduce_states(r); }; };
  ReduceArgs r = fx.reduce_args();
  r.workspace = nullptr;
  expect_invalid(reduce(r), "workspace", "null workspace");
  r = fx.reduce_args();
  r.workspace = misalign(r.workspace);
  expect_invalid(reduce(r), "workspace", "misaligned workspace");
  r = fx.reduce_args();
  r.workspace_bytes = splitk_workspace_bytes(r.num_seqs, r.num_q_heads, 64, r.num_splits) - 1;
  expect_invalid(reduce(r), "workspace_bytes", "workspace too small");
  r = fx.reduce_args();
  r.out = nullptr;
  expect_invalid(reduce(r), "out", "null out");
  r = fx.reduce_args();
  r.out = misalign(r.out);
  expect_invalid(reduce(r), "out", "misaligned out");
  for (int32_t n : {0, kMaxSplits + 1}) {
    r = fx.reduce_args();
    r.num_splits = n;
    expect_invalid(reduce(r), "num_splits", "num_splits " + std::to_string(n));
  }
  r = fx.reduce_args();
  r.head_dim = 96;
  expect_unsupported(reduce(r), "head_dim", "head_dim 96");
  r = fx.reduce_args();
  r.num_q_heads = 0;
  expect_invalid(reduce(r), "num_q_heads", "num_q_heads 0");
  EXPECT_TRUE(fx.output_untouched());
}

TEST(Validation, CacheWrite) {
  for (KvFormat f : {KvFormat::bf16, KvFormat::fp8_e4m3, KvFormat::nvfp4}) {
    DecodeCase c;
    c.format = f;
    c.head_dim = 64;
    c.seq_lens = {20, 7};
    HostProblem p = make_problem(c, 5);
    const std::vector<uint8_t> k_before = p.k_cache, v_before = p.v_cache;
    const CacheWriteArgs good = p.write_args();
    auto write = [](CacheWriteArgs w) { return [w] { cpu::reshape_and_cache(w); }; };
    const int64_t row = int64_t(c.num_kv_heads) * c.head_dim;
    CacheWriteArgs w = good;
    w.key = nullptr;
    expect_invalid(write(w), "key", "null key");
    w = good;
    w.key = misalign(w.key);
    expect_invalid(write(w), "key", "misaligned key");
    w = good;
    w.value = nullptr;
    expect_invalid(write(w), "value", "null value");
    w = good;
    w.value = misalign(w.value);
    expect_invalid(write(w), "value", "misaligned value");
    w = good;
    w.slot_mapping = nullptr;
    expect_invalid(write(w), "slot_mapping", "null slot_mapping");
    w = good;
    w.key_stride = row - 8;
    expect_invalid(write(w), "key_stride", "key_stride too small");
    w = good;
    w.key_stride = row + 4;
    expect_invalid(write(w), "key_stride", "key_stride not a multiple of 8");
    w = good;
    w.value_stride = row - 8;
    expect_invalid(write(w), "value_stride", "value_stride too small");
    w = good;
    w.num_tokens = -1;
    expect_invalid(write(w), "num_tokens", "negative num_tokens");
    w = good;
    w.cache.k = nullptr;
    expect_invalid(write(w), "cache.k", "null cache.k");
    w = good;
    w.cache.v = misalign(w.cache.v);
    expect_invalid(write(w), "cache.v", "misaligned cache.v");
    w = good;
    w.cache.layout.head_dim = 96;
    expect_unsupported(write(w), "head_dim", "head_dim 96");
    w = good;
    w.cache.layout.block_size = 8;
    expect_unsupported(write(w), "block_size", "block_size 8");
    w = good;
    w.cache.layout.page_stride_bytes -= 16;
    expect_invalid(write(w), "page_stride_bytes", "page stride too small");
    if (f == KvFormat::fp8_e4m3) {
      w = good;
      w.cache.scales.k_scale = 0.0f;
      expect_invalid(write(w), "k_scale", "fp8 k_scale 0");
      w = good;
      w.cache.scales.v_scale = kNaN;
      expect_invalid(write(w), "v_scale", "fp8 v_scale NaN");
    }
    if (f == KvFormat::nvfp4) {
      w = good;
      w.cache.scales.k_global_scale = -2.0f;
      expect_invalid(write(w), "k_global_scale", "nvfp4 k_global_scale -2");
      w = good;
      w.cache.scales.v_global_scale = kInf;
      expect_invalid(write(w), "v_global_scale", "nvfp4 v_global_scale inf");
    }
    EXPECT_TRUE(p.k_cache == k_before && p.v_cache == v_before) << "cache written despite an error";
  }
}

TEST(Validation, Absmax) {
  std::vector<bf16> x(64, bf16{0x3f80});
  float m = 0.0f;
  expect_invalid([&] { cpu::bf16_absmax(x.data(), 2, 32, 32, nullptr); }, "absmax", "null absmax");
  expect_invalid([&] { cpu::bf16_absmax(nullptr, 2, 32, 32, &m); }, "'x'", "null x");
  expect_invalid([&] { cpu::bf16_absmax(x.data(), 2, 32, 16, &m); }, "row_stride", "row_stride < row_len");
  expect_invalid([&] { cpu::bf16_absmax(x.data(), -1, 32, 32, &m); }, "num_rows", "negative num_rows");
  expect_invalid([&] { cpu::bf16_absmax(x.data(), 1, -2, 32, &m); }, "row_len", "negative row_len");
  EXPECT_EQ(m, 0.0f);
}

TEST(Validation, Planner) {
  AttnProblem dp;
  dp.num_seqs = 4;
  dp.num_q_heads = 8;
  dp.layout = KvCacheLayout::bf16(100, 16, 2, 128);
  dp.max_seq_len = 1000;
  auto sms = [](int32_t n) {
    AttnTarget t;
    t.num_sms = n;
    return t;
  };
  EXPECT_NO_THROW(plan_attention(dp, sms(132)));
  expect_invalid([&] { plan_attention(dp, sms(0)); }, "num_sms", "0 SMs");
  AttnProblem bad = dp;
  bad.num_q_heads = 7;
  expect_invalid([&] { plan_attention(bad, sms(132)); }, "num_q_heads", "num_q_heads not a multiple");
  bad = dp;
  bad.max_seq_len = -1;
  expect_invalid([&] { plan_attention(bad, sms(132)); }, "max_seq_len", "negative max_seq_len");
  bad = dp;
  bad.sliding_window = -4;
  expect_invalid([&] { plan_attention(bad, sms(132)); }, "sliding_window", "negative window");
  bad = dp;
  bad.layout.head_dim = 96;
  expect_unsupported([&] { plan_attention(bad, sms(132)); }, "head_dim", "head_dim 96");
  // Forced choices the problem or the target cannot run.
  test::PlanChoices o;
  o.num_splits = kMaxSplits + 1;
  expect_invalid([&] { test::plan_with(dp, sms(132), o); }, "num_splits", "num_splits past kMaxSplits");
  o = {};
  o.pairing = detail::Toggle::on;
  expect_unsupported([&] { test::plan_with(dp, sms(132), o); }, "pairing", "pairing at head_dim 128");
  o = {};
  o.load_path = detail::LoadPath::tma;
  expect_unsupported([&] { test::plan_with(dp, sms(132), o); }, "load_path", "tma on a target without TMA");
  o = {};
  o.num_splits = 4;
  o.merge = SplitMerge::cluster;
  expect_unsupported([&] { test::plan_with(dp, sms(132), o); }, "merge", "cluster on a target without clusters");
  o.merge = SplitMerge::single_pass;
  expect_invalid([&] { test::plan_with(dp, sms(132), o); }, "merge", "single pass with 4 splits");
}

// ---- the debug block-table validator ----

TEST(Validation, BlockTablesAcceptValidProblems) {
  // make_problem leaves INVALID ids outside every attended range (past the
  // length, pages wholly before the window): the validator must ignore them.
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (int32_t window : {0, 5, 40, 1000}) {
    DecodeCase c;
    c.sliding_window = window;
    c.seq_lens = interesting_lengths(16, 200, 10, seed + window);
    const HostProblem p = make_problem(c, seed);
    EXPECT_NO_THROW(validate_block_tables(p.layout, p.block_tables.data(), p.max_blocks_per_seq, p.seq_lens.data(),
                                          p.num_seqs(), window))
        << c.describe();
  }
}

TEST(Validation, BlockTablesCatchBadLengthsAndPages) {
  DecodeCase c;
  c.seq_lens = {40, 17, 0};
  c.sliding_window = 20;
  const HostProblem p = make_problem(c, 9);
  const int32_t mb = p.max_blocks_per_seq;
  auto check = [&](const std::vector<int32_t>& tables, const std::vector<int32_t>& lens) {
    return [&p, tables, lens, mb] {
      validate_block_tables(p.layout, tables.data(), mb, lens.data(), int32_t(lens.size()), p.c.sliding_window);
    };
  };
  std::vector<int32_t> lens = p.seq_lens;
  lens[1] = mb * 16 + 1;
  expect_invalid(check(p.block_tables, lens), "seq_lens", "seq_len past the row");
  lens = p.seq_lens;
  lens[2] = -1;
  expect_invalid(check(p.block_tables, lens), "seq_lens", "negative seq_len");
  // seq 0 attends to positions [20, 40): pages 1 and 2.
  for (int32_t bad : {-1, int32_t(p.layout.num_blocks), int32_t(p.layout.num_blocks) + 50}) {
    std::vector<int32_t> t = p.block_tables;
    t[2] = bad;
    expect_invalid(check(t, p.seq_lens), "block_tables", "page id " + std::to_string(bad));
  }
  std::vector<int32_t> t = p.block_tables;
  t[0] = -7;  // page 0 of seq 0 lies wholly before its window: ignored
  EXPECT_NO_THROW(check(t, p.seq_lens)());
  t[size_t(mb) - 1] = -7;  // past its length: ignored
  EXPECT_NO_THROW(check(t, p.seq_lens)());
}

}  // namespace
}  // namespace metrale::test
