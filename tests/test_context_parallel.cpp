// Context-parallel decode (metrale/context_parallel.hpp) without a
// transport: every rank's shard is run one after another in this process
// (CPU backend, and the CUDA backend on one GPU when present), the rank
// blocks are gathered by a host/device copy exactly as ncclAllGather lays
// them out (rank-major), merged, and compared with the float64 reference
// (docs/spec.md 5) and with the single-process decode. The sharding itself is
// checked position by position.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "testing/forced_plans.hpp"
#include "metrale/context_parallel.hpp"
#include "metrale/cpu.hpp"
#include "metrale/cuda.hpp"
#include "metrale/error.hpp"
#include "support/device_problem.hpp"
#include "support/problem.hpp"
#include "support/runs_problem.hpp"
#include "testing/reference.hpp"

namespace metrale::test {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::string spec_name(const cp::ShardSpec& s, int32_t splits) {
  return std::string(s.kind == cp::Sharding::contiguous ? "contiguous" : "interleaved") + " R=" +
         std::to_string(s.num_ranks) + " chunk=" + std::to_string(s.chunk_pages) + " splits/rank=" +
         std::to_string(splits);
}

std::vector<cp::RankShard> shards_of(const HostProblem& hp, const cp::ShardSpec& spec) {
  return cp::make_shards(spec, hp.block_tables.data(), hp.max_blocks_per_seq, hp.seq_lens.data(), hp.num_seqs(),
                         hp.layout.block_size, hp.c.sliding_window);
}

// The whole context-parallel step on the CPU backend, ranks one after another.
std::vector<bf16> run_cp_cpu(const HostProblem& hp, const cp::ShardSpec& spec, int32_t splits_per_rank) {
  std::vector<bf16> out = poisoned_bf16(hp.out_elems());
  const AttnArgs global = hp.args(out.data());
  const std::vector<cp::RankShard> shards = shards_of(hp, spec);
  const cp::CpLayout L = cp::make_layout(spec.num_ranks, global, splits_per_rank, hp.c.sliding_window > 0);
  std::vector<float> gathered(L.gathered_floats(), kNaN), merged(L.merged_floats(), kNaN);
  for (int32_t r = 0; r < spec.num_ranks; ++r) {
    const cp::RankShard& s = shards[size_t(r)];
    const AttnArgs ra = cp::rank_attn_args(global, s, s.block_tables.data(), s.seq_lens.data());
    std::vector<float> block(L.rank_floats(), kNaN);  // the rank's own buffer (its GPU)
    cpu::cp_rank_states(L, ra, s.edges.data(), block.data());
    // "ncclAllGather": rank r's block lands at offset r * rank_floats on every rank.
    std::copy(block.begin(), block.end(), gathered.begin() + ptrdiff_t(size_t(r) * L.rank_floats()));
  }
  cpu::cp_merge(L, gathered.data(), merged.data(), out.data());
  EXPECT_EQ(count_poison(out.data(), out.size()), 0) << "output elements left unwritten";
  return out;
}

std::vector<bf16> run_single_cpu(const HostProblem& hp) {
  std::vector<bf16> out = poisoned_bf16(hp.out_elems());
  test::cpu_single_pass(hp.args(out.data()));
  return out;
}

std::vector<double> as_double(const std::vector<bf16>& x) {
  std::vector<double> d(x.size());
  for (size_t i = 0; i < x.size(); ++i) d[i] = codec::bf16_to_float(x[i]);
  return d;
}

void expect_close(const HostProblem& hp, const std::vector<bf16>& out, const std::vector<double>& ref,
                  const std::vector<double>& single, const std::string& what) {
  const Comparison a = compare_decode(out.data(), ref, hp.num_seqs(), hp.num_q_heads(), hp.layout.head_dim);
  EXPECT_TRUE(a.ok) << what << " vs float64 reference: " << a.report;
  const Comparison b = compare_decode(out.data(), single, hp.num_seqs(), hp.num_q_heads(), hp.layout.head_dim);
  EXPECT_TRUE(b.ok) << what << " vs single-process decode: " << b.report;
}

// Every spec the tests sweep for R ranks.
std::vector<cp::ShardSpec> specs_for(int32_t R) {
  return {{cp::Sharding::contiguous, R, 0}, {cp::Sharding::contiguous, R, 1}, {cp::Sharding::contiguous, R, 3},
          {cp::Sharding::interleaved, R, 1}, {cp::Sharding::interleaved, R, 2}};
}

DecodeCase random_case(std::mt19937_64& rng) {
  DecodeCase c;
  c.format = KvFormat(rng() % 3);
  c.head_dim = int32_t(pick(rng, 64, 128, 64));
  c.block_size = int32_t(pick(rng, 16, 16, 32, 64));
  c.num_kv_heads = int32_t(pick(rng, 1, 2));
  c.group = int32_t(pick(rng, 1, 2, 4));
  const int32_t max_len = int32_t(pick(rng, 1, 17, 90, 300, 700));
  c.seq_lens = interesting_lengths(c.block_size, max_len, int32_t(pick(rng, 1, 3, 6)), rng());
  c.sliding_window = int32_t(pick(rng, 0, 0, 1, 5, 37, 100, 256));
  c.q_stride_pad = 8 * int64_t(rng() % 2);
  c.q_head_major = rng() % 3 == 0;  // q as transformers hands it at batch 1
  c.page_pad_bytes = 16 * int64_t(rng() % 2);
  if (c.format == KvFormat::nvfp4) c.k_global_scale = c.v_global_scale = (rng() % 2) ? 1.0f : -1.0f;
  return c;
}

// ---------------------------------------------------------------- sharding

TEST(ContextParallelShard, OwnerOfPageRules) {
  using cp::Sharding;
  // contiguous, default chunk = ceil(n / R): 10 pages over 4 ranks -> 3,3,3,1
  const int32_t want_c[10] = {0, 0, 0, 1, 1, 1, 2, 2, 2, 3};
  for (int32_t p = 0; p < 10; ++p) EXPECT_EQ(cp::owner_of_page({Sharding::contiguous, 4, 0}, p, 10), want_c[p]);
  // 2 pages over 4 ranks: ranks 2, 3 own nothing
  EXPECT_EQ(cp::owner_of_page({Sharding::contiguous, 4, 0}, 0, 2), 0);
  EXPECT_EQ(cp::owner_of_page({Sharding::contiguous, 4, 0}, 1, 2), 1);
  // contiguous fixed chunks: the last rank takes the rest
  EXPECT_EQ(cp::owner_of_page({Sharding::contiguous, 3, 2}, 5, 100), 2);
  EXPECT_EQ(cp::owner_of_page({Sharding::contiguous, 3, 2}, 99, 100), 2);
  EXPECT_EQ(cp::owner_of_page({Sharding::contiguous, 3, 2}, 3, 100), 1);
  // interleaved
  for (int32_t p = 0; p < 20; ++p) {
    EXPECT_EQ(cp::owner_of_page({Sharding::interleaved, 3, 0}, p, 20), p % 3);
    EXPECT_EQ(cp::owner_of_page({Sharding::interleaved, 3, 2}, p, 20), (p / 2) % 3);
  }
  EXPECT_THROW(cp::owner_of_page({Sharding::interleaved, 0, 0}, 0, 1), InvalidArgument);
  EXPECT_THROW(cp::owner_of_page({Sharding::interleaved, 2, 0}, 5, 5), InvalidArgument);
}

// Every attended global position [window_start, L) is covered exactly once
// over the ranks (main pass pages + edge slice), nothing else is; the rank
// tables hold the global row's page ids; a partial page is always the last
// of a rank's row.
TEST(ContextParallelShard, EveryAttendedPositionExactlyOnce) {
  std::mt19937_64 rng(random_seed());
  for (int iter = 0; iter < 400; ++iter) {
    const int32_t B = std::vector<int32_t>{1, 2, 16, 32}[rng() % 4];
    const int32_t S = 1 + int32_t(rng() % 6), mb = 1 + int32_t(rng() % 12);
    const int32_t W = std::vector<int32_t>{0, 0, 1, 2, 7, 16, 33, 1000}[rng() % 8];
    const cp::ShardSpec spec{cp::Sharding(rng() % 2), 1 + int32_t(rng() % 6), int32_t(rng() % 4)};
    std::vector<int32_t> lens(static_cast<size_t>(S)), table(static_cast<size_t>(S) * mb);
    for (auto& l : lens) l = std::min<int32_t>(mb * B, (rng() % 4 == 0) ? int32_t(rng() % 3) : int32_t(rng() % (mb * B + 1)));
    for (auto& t : table) t = int32_t(rng() % 100000);
    SCOPED_TRACE(spec_name(spec, 1) + " B=" + std::to_string(B) + " W=" + std::to_string(W));
    const auto shards = cp::make_shards(spec, table.data(), mb, lens.data(), S, B, W);
    ASSERT_EQ(shards.size(), size_t(spec.num_ranks));
    for (int32_t i = 0; i < S; ++i) {
      const int32_t L = lens[size_t(i)], ws = window_start(L, W);
      std::vector<int> hits(size_t(std::max(L, 1)), 0);
      for (const cp::RankShard& s : shards) {
        ASSERT_EQ(s.has_edge, W > 0);
        const int32_t smb = s.max_blocks_per_seq;
        int32_t covered = 0;
        for (int32_t j = 0; j < smb && covered < s.seq_lens[size_t(i)]; ++j) {
          const int32_t g = s.global_page[size_t(i) * smb + j];
          ASSERT_GE(g, 0);
          EXPECT_EQ(s.block_tables[size_t(i) * smb + j], table[size_t(i) * mb + g]);
          const int32_t take = std::min(B, s.seq_lens[size_t(i)] - covered);
          // a local page holds global positions [g*B, g*B + take): a partial one only at the very end
          EXPECT_TRUE(take == B || g * B + take == L) << "partial page not at the end of the sequence";
          for (int32_t t = 0; t < take; ++t) ++hits[size_t(g * B + t)];
          covered += take;
        }
        EXPECT_EQ(covered, s.seq_lens[size_t(i)]);
        const cp::EdgeSlice e = s.edges[size_t(i)];
        if (e.page >= 0) {
          EXPECT_EQ(e.page, table[size_t(i) * mb + ws / B]);
          EXPECT_EQ(e.begin, ws % B);
          for (int32_t t = e.begin; t < e.end; ++t) ++hits[size_t(ws / B * B + t)];
        }
      }
      for (int32_t pos = 0; pos < L; ++pos)
        ASSERT_EQ(hits[size_t(pos)], pos >= ws ? 1 : 0) << "seq " << i << " L=" << L << " position " << pos;
    }
  }
}

TEST(ContextParallelShard, BadArgumentsThrow) {
  const int32_t table[4] = {0, 1, 2, 3}, lens[2] = {20, 40};
  const cp::ShardSpec spec{cp::Sharding::contiguous, 2, 0};
  EXPECT_THROW(cp::make_rank_shard(spec, 2, table, 2, lens, 2, 16, 0), InvalidArgument);  // rank out of range
  EXPECT_THROW(cp::make_rank_shard(spec, 0, table, 2, lens, 2, 16, -1), InvalidArgument);
  const int32_t too_long[2] = {20, 33};  // 33 > 2 pages * 16
  EXPECT_THROW(cp::make_rank_shard(spec, 0, table, 2, too_long, 2, 16, 0), InvalidArgument);
  cp::CpLayout L;
  L.num_ranks = 64;
  L.num_seqs = 1;
  L.num_q_heads = 1;
  L.head_dim = 64;
  L.splits_per_rank = 4;
  L.has_edge = true;  // 64 * 5 > 256
  EXPECT_THROW(L.validate(), InvalidArgument);
  L.has_edge = false;
  EXPECT_NO_THROW(L.validate());  // 64 * 4 = 256
}

// The merge's permute puts rank r's split s (and its edge record) at
// ((seq*H + h)*R + r)*slots + j of the reduce's workspace.
TEST(ContextParallelMerge, GatheredRecordsLandWhereTheReduceReadsThem) {
  cp::CpLayout L;
  L.num_ranks = 3;
  L.num_seqs = 2;
  L.num_q_heads = 3;
  L.head_dim = 64;
  L.splits_per_rank = 2;
  L.has_edge = true;
  const size_t rec = L.record_floats();
  std::vector<float> gathered(L.gathered_floats());
  // record (r, seq*H+h, j): o = code, m = 0, l = 1, code = 1000 r + 10 row + j
  for (int32_t r = 0; r < 3; ++r)
    for (int32_t row = 0; row < 6; ++row)
      for (int32_t j = 0; j < 3; ++j) {
        float* p = gathered.data() + size_t(r) * L.rank_floats() +
                   (j < 2 ? (size_t(row) * 2 + j) * rec : L.splitk_floats() + size_t(row) * rec);
        for (int d = 0; d < 64; ++d) p[d] = float(1000 * r + 10 * row + j);
        p[64] = 0.0f;
        p[65] = 1.0f;
      }
  std::vector<float> merged(L.merged_floats(), kNaN);
  std::vector<bf16> out(size_t(2 * 3 * 64));
  cpu::cp_merge(L, gathered.data(), merged.data(), out.data());
  for (int32_t row = 0; row < 6; ++row)
    for (int32_t r = 0; r < 3; ++r)
      for (int32_t j = 0; j < 3; ++j)
        EXPECT_EQ(merged[((size_t(row) * 3 + r) * 3 + j) * rec], float(1000 * r + 10 * row + j));
  // equal weights: mean of the nine codes of the row
  for (int32_t row = 0; row < 6; ++row)
    for (int d = 0; d < 64; ++d) EXPECT_NEAR(codec::bf16_to_float(out[size_t(row) * 64 + d]), 1000.0 + 10 * row + 1, 8.0);
}

// ---------------------------------------------------------------- CPU end to end

TEST(ContextParallelCpu, EdgeCasesEveryRankCount) {
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (KvFormat f : {KvFormat::bf16, KvFormat::fp8_e4m3, KvFormat::nvfp4}) {
    for (int32_t W : {0, 1, 5, 20, 64}) {
      DecodeCase c;
      c.format = f;
      c.head_dim = 64;
      c.block_size = 16;
      c.num_kv_heads = 2;
      c.group = 2;
      c.seq_lens = {0, 1, 15, 16, 17, 33, 70, 100};  // shorter than R pages too
      c.sliding_window = W;
      const HostProblem hp = make_problem(c, seed + 97 * W + int(f));
      const std::vector<double> ref = reference_attention(hp), single = as_double(run_single_cpu(hp));
      for (int32_t R = 1; R <= 5; ++R)
        for (const cp::ShardSpec& spec : specs_for(R))
          for (int32_t ns : {1, 2})
            expect_close(hp, run_cp_cpu(hp, spec, ns), ref, single,
                         c.describe() + " " + spec_name(spec, ns));
      if (HasFailure()) return;
    }
  }
}

TEST(ContextParallelCpu, RandomizedMatrix) {
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 150; ++iter) {
    const DecodeCase c = random_case(rng);
    SCOPED_TRACE(c.describe());
    const HostProblem hp = make_problem(c, rng());
    const std::vector<double> ref = reference_attention(hp), single = as_double(run_single_cpu(hp));
    for (int32_t R = 1; R <= 5; ++R) {
      const auto specs = specs_for(R);
      const cp::ShardSpec spec = specs[rng() % specs.size()];
      const int32_t ns = 1 + int32_t(rng() % 3);
      expect_close(hp, run_cp_cpu(hp, spec, ns), ref, single, spec_name(spec, ns));
    }
    if (HasFailure()) return;
  }
}

// A NaN in K of the window's partially masked first page (the edge pass)
// reaches that sequence only; a NaN in its masked part reaches nothing.
TEST(ContextParallelCpu, NanInEdgePage) {
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (KvFormat f : {KvFormat::bf16, KvFormat::fp8_e4m3, KvFormat::nvfp4}) {
    for (int32_t pos : {25, 21}) {  // L = 50, W = 27 -> window starts at 23 (page 1, offset 7)
      DecodeCase c;
      c.format = f;
      c.head_dim = 64;
      c.seq_lens = {50, 50};
      c.sliding_window = 27;
      HostProblem hp = make_problem(c, seed + int(f));
      for (int d = 0; d < c.head_dim; ++d) poison_cache(hp, 'k', 1, pos, 0, d);  // kv head 0
      const std::vector<double> ref = reference_attention(hp);
      for (int32_t R : {1, 2, 3}) {
        const cp::ShardSpec spec{cp::Sharding::interleaved, R, 1};
        const std::vector<bf16> out = run_cp_cpu(hp, spec, 1);
        const Comparison cmp = compare_decode(out.data(), ref, hp.num_seqs(), hp.num_q_heads(), c.head_dim);
        EXPECT_TRUE(cmp.ok) << to_string(f) << " pos " << pos << " R " << R << ": " << cmp.report;
        const bool nan = std::isnan(codec::bf16_to_float(out[size_t(1 * hp.num_q_heads()) * c.head_dim]));
        EXPECT_EQ(nan, pos >= 23) << to_string(f) << " pos " << pos << " R " << R;
        EXPECT_FALSE(std::isnan(codec::bf16_to_float(out[0])));
      }
    }
  }
}

TEST(ContextParallelCpu, RankArgsMustNotCarryAWindow) {
  DecodeCase c;
  c.seq_lens = {40};
  c.sliding_window = 10;
  const HostProblem hp = make_problem(c, 1);
  std::vector<bf16> out(hp.out_elems());
  const AttnArgs g = hp.args(out.data());
  const cp::CpLayout L = cp::make_layout(2, g, 1, true);
  std::vector<float> block(L.rank_floats());
  std::vector<cp::EdgeSlice> edges(1);
  EXPECT_THROW(cpu::cp_rank_states(L, g, edges.data(), block.data()), InvalidArgument);
}

// ---------------------------------------------------------------- GPU (one GPU, ranks in turn)

std::vector<bf16> run_cp_gpu(const HostProblem& hp, DeviceProblem& dp, const cp::ShardSpec& spec,
                             int32_t splits_per_rank, bool* guards_ok) {
  dp.poison_out();
  const AttnArgs global = dp.args();
  const std::vector<cp::RankShard> shards = shards_of(hp, spec);
  const cp::CpLayout L = cp::make_layout(spec.num_ranks, global, splits_per_rank, hp.c.sliding_window > 0);
  DeviceBuffer<float> gathered(L.gathered_floats()), merged(L.merged_floats());
  bool ok = true;
  for (int32_t r = 0; r < spec.num_ranks; ++r) {
    const cp::RankShard& s = shards[size_t(r)];
    DeviceBuffer<int32_t> tables(s.block_tables), lens(s.seq_lens);
    DeviceBuffer<cp::EdgeSlice> edges(s.edges);
    DeviceBuffer<float> block(L.rank_floats());
    const AttnArgs ra = cp::rank_attn_args(global, s, tables.get(), lens.get());
    cuda::cp_rank_states(L, ra, edges.get(), block.get());
    METRALE_CUDA_OK(cudaMemcpy(gathered.get() + size_t(r) * L.rank_floats(), block.get(), block.bytes(),
                               cudaMemcpyDeviceToDevice));
    METRALE_CUDA_OK(cudaDeviceSynchronize());
    ok = ok && block.guards_intact() && tables.guards_intact() && lens.guards_intact() && edges.guards_intact();
  }
  cuda::cp_merge(L, gathered.get(), merged.get(), global.out);
  METRALE_CUDA_OK(cudaDeviceSynchronize());
  *guards_ok = ok && gathered.guards_intact() && merged.guards_intact() && dp.out_guards_intact();
  return dp.download_out();
}

TEST(ContextParallelGpu, EdgeCasesEveryRankCount) {
  METRALE_SKIP_WITHOUT_GPU();
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (KvFormat f : {KvFormat::bf16, KvFormat::fp8_e4m3, KvFormat::nvfp4}) {
    for (int32_t W : {0, 1, 5, 20, 64}) {
      DecodeCase c;
      c.format = f;
      c.num_kv_heads = 2;
      c.group = 4;
      c.seq_lens = {0, 1, 15, 16, 17, 33, 70, 100, 1000};
      c.sliding_window = W;
      const HostProblem hp = make_problem(c, seed + 97 * W + int(f));
      const std::vector<double> ref = reference_attention(hp), single = as_double(run_single_cpu(hp));
      DeviceProblem dp(hp);
      for (int32_t R = 1; R <= 5; ++R)
        for (const cp::ShardSpec& spec : specs_for(R))
          for (int32_t ns : {1, 3}) {
            bool guards = false;
            const std::vector<bf16> out = run_cp_gpu(hp, dp, spec, ns, &guards);
            EXPECT_TRUE(guards) << "a guard region was written";
            expect_close(hp, out, ref, single, c.describe() + " " + spec_name(spec, ns));
          }
      EXPECT_TRUE(dp.inputs_intact());
      if (HasFailure()) return;
    }
  }
}

TEST(ContextParallelGpu, RandomizedMatrix) {
  METRALE_SKIP_WITHOUT_GPU();
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 40; ++iter) {
    DecodeCase c = random_case(rng);
    c.head_dim = std::vector<int32_t>{64, 128, 256}[rng() % 3];
    c.block_size = std::vector<int32_t>{16, 32, 64, 128}[rng() % 4];
    c.group = std::vector<int32_t>{1, 4, 8}[rng() % 3];
    SCOPED_TRACE(c.describe());
    const HostProblem hp = make_problem(c, rng());
    const std::vector<double> ref = reference_attention(hp), single = as_double(run_single_cpu(hp));
    DeviceProblem dp(hp);
    for (int32_t R = 1; R <= 5; ++R) {
      const auto specs = specs_for(R);
      const cp::ShardSpec spec = specs[rng() % specs.size()];
      const int32_t ns = 1 + int32_t(rng() % 4);
      bool guards = false;
      const std::vector<bf16> out = run_cp_gpu(hp, dp, spec, ns, &guards);
      EXPECT_TRUE(guards) << "a guard region was written";
      expect_close(hp, out, ref, single, spec_name(spec, ns));
    }
    if (HasFailure()) return;
  }
}

// Query runs over a context sharded in contiguous page ranges (shard views,
// docs/context_parallel.md 7), CPU backend: every rank attends the whole run
// over its view, the gathered records merge into the float64 reference's
// output and into the single-process run's (up to the merge order's
// rounding), windows and empty ranks included; the views are the rank's
// positions; an interleaved spec and the CUDA backend say Unsupported.
TEST(ContextParallel, QueryRunsOverContiguousShards) {
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 12; ++iter) {
    DecodeCase c;
    c.format = std::vector<KvFormat>{KvFormat::bf16, KvFormat::fp8_e4m3, KvFormat::nvfp4}[iter % 3];
    c.head_dim = int32_t(pick(rng, 64, 128));
    c.num_kv_heads = 2;
    c.group = int32_t(pick(rng, 1, 4));
    c.block_size = int32_t(pick(rng, 16, 32));
    c.sliding_window = int32_t(pick(rng, 0, 0, 50, 300));
    c.seq_lens = {int32_t(200 + rng() % 900), int32_t(1 + rng() % 60), 0, int32_t(300 + rng() % 500)};
    const std::vector<int32_t> runs = {int32_t(1 + rng() % 150), int32_t(rng() % 2), 0, c.seq_lens[3]};
    RunsProblem rp(c, runs, rng());
    const cp::ShardSpec spec{cp::Sharding::contiguous, int32_t(pick(rng, 2, 3, 4)), int32_t(pick(rng, 0, 0, 5))};
    const int32_t splits = int32_t(pick(rng, 1, 2));
    SCOPED_TRACE(c.describe() + " ranks " + std::to_string(spec.num_ranks) + " chunk " +
                 std::to_string(spec.chunk_pages) + " splits/rank " + std::to_string(splits));
    std::vector<bf16> single(rp.out_elems());
    test::cpu_single_pass(rp.args(single.data()));
    const AttnArgs global = rp.args(nullptr);
    const cp::CpLayout L = cp::run_layout(spec.num_ranks, global, splits);
    std::vector<float> gathered(L.gathered_floats(), kNaN), merged(L.merged_floats());
    std::vector<cp::RunShard> shards;
    for (int32_t r = 0; r < spec.num_ranks; ++r) {
      shards.push_back(cp::make_run_shard(spec, r, rp.p.block_tables.data(), rp.p.max_blocks_per_seq,
                                          rp.p.seq_lens.data(), rp.p.num_seqs(), rp.p.layout.block_size));
      const cp::RunShard& sh = shards.back();
      const AttnArgs ra = cp::rank_attn_args(global, sh, sh.block_tables.data(), sh.kv_start.data(),
                                                  sh.kv_lens.data());
      test::cpu_split_states(ra, cp::rank_splitk_workspace(L, gathered.data() + r * L.rank_floats()));
    }
    // The views tile every sequence's positions in rank order.
    for (int32_t i = 0; i < rp.p.num_seqs(); ++i) {
      int32_t covered = 0;
      for (const cp::RunShard& sh : shards) {
        if (sh.kv_lens[size_t(i)] == 0) continue;
        EXPECT_EQ(sh.kv_start[size_t(i)], covered) << "sequence " << i << " rank " << sh.rank;
        covered += sh.kv_lens[size_t(i)];
      }
      EXPECT_EQ(covered, rp.p.seq_lens[size_t(i)]) << "sequence " << i;
    }
    std::vector<bf16> out(rp.out_elems());
    cpu::cp_merge(L, gathered.data(), merged.data(), out.data());
    expect_runs_match(rp, out, "merged ranks");
    const Comparison same = compare_decode(out.data(), as_double(single), rp.rows(), rp.p.num_q_heads(),
                                           rp.p.layout.head_dim);
    EXPECT_TRUE(same.ok) << "merged vs single process: " << same.report;
    if (HasFailure()) return;
  }
  DecodeCase sc;
  sc.seq_lens = {40, 5, 0, 20};
  RunsProblem small(sc, {3, 1, 0, 2}, 7);
  const cp::ShardSpec inter{cp::Sharding::interleaved, 2, 1};
  EXPECT_THROW(cp::make_run_shard(inter, 0, small.p.block_tables.data(), small.p.max_blocks_per_seq,
                                  small.p.seq_lens.data(), small.p.num_seqs(), small.p.layout.block_size),
               Unsupported);
  // A bad view: a start off the page grid, a view past its sequence.
  std::vector<bf16> out(small.out_elems());
  AttnArgs a = small.args(out.data());
  std::vector<int32_t> start(size_t(a.num_seqs), 0), lens(size_t(a.num_seqs), 0);
  a.kv_start = start.data();
  EXPECT_THROW(test::cpu_single_pass(a), InvalidArgument);  // kv_lens missing
  a.kv_lens = lens.data();
  start[0] = 3;
  EXPECT_THROW(test::cpu_single_pass(a), InvalidArgument);
  start[0] = 0;
  lens[0] = small.p.seq_lens[0] + 1;
  EXPECT_THROW(test::cpu_single_pass(a), InvalidArgument);
  lens[0] = 0;
  test::cpu_single_pass(a);  // empty views: every output 0
  for (bf16 x : out) EXPECT_EQ(codec::bf16_to_float(x), 0.0f);
  if (cuda::available()) EXPECT_THROW(test::cuda_single_pass(a), Unsupported);
}

}  // namespace
}  // namespace metrale::test
