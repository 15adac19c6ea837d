// The page allocator (metrale/block_allocator.hpp): it must never leak a
// page nor hand one out twice, whatever the order of allocations, shares and
// frees; a shared page goes back to the pool with its last holder; a holder
// of a shared page gets a fresh one to write into (copy-on-write); and
// bookkeeping bugs (freeing an unknown or already-free page) fail with a
// typed metrale error. Also, where apps/ is built, a short serve-sim run on
// the CPU backend: finite outputs and every page back in the pool at the end.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "metrale/block_allocator.hpp"
#include "metrale/error.hpp"

namespace {

using metrale::BlockAllocator;

// Invariants: free + used == total; the pages held outside are exactly the used ones.
void expect_consistent(const BlockAllocator& a, const std::set<int32_t>& held) {
  ASSERT_EQ(a.num_free() + a.num_used(), a.total());
  ASSERT_EQ(a.num_used(), int32_t(held.size()));
  for (int32_t b : held) ASSERT_TRUE(a.is_used(b)) << b;
}

TEST(BlockAllocator, HandsOutEveryPageOnceThenNothing) {
  BlockAllocator a(37);
  std::set<int32_t> held;
  for (int i = 0; i < 37; ++i) {
    const std::optional<int32_t> b = a.allocate();
    ASSERT_TRUE(b.has_value());
    ASSERT_GE(*b, 0);
    ASSERT_LT(*b, 37);
    ASSERT_TRUE(held.insert(*b).second) << "page " << *b << " handed out twice";
  }
  EXPECT_FALSE(a.allocate().has_value());
  EXPECT_EQ(a.num_free(), 0);
  expect_consistent(a, held);
  for (int32_t b : held) a.free(b);
  EXPECT_EQ(a.num_used(), 0);
  EXPECT_EQ(a.num_free(), 37);
}

TEST(BlockAllocator, RandomizedAllocFreeKeepsInvariants) {
  for (uint64_t seed : {1u, 2u, 3u, 4u, 5u}) {
    std::mt19937_64 rng(seed);
    const int32_t total = int32_t(1 + rng() % 200);
    BlockAllocator a(total);
    std::set<int32_t> held;
    std::vector<int32_t> order;  // held pages in a shuffled order, freed from random positions
    for (int op = 0; op < 20000; ++op) {
      // Bias towards allocation or towards freeing in phases, to reach both full and empty pools.
      const bool grow = (op / 1000) % 2 == 0 ? rng() % 4 != 0 : rng() % 4 == 0;
      if (grow) {
        const std::optional<int32_t> b = a.allocate();
        if (int32_t(held.size()) == total) {
          ASSERT_FALSE(b.has_value());
        } else {
          ASSERT_TRUE(b.has_value());
          ASSERT_TRUE(held.insert(*b).second) << "page " << *b << " handed out twice (seed " << seed << ")";
          order.push_back(*b);
        }
      } else if (!order.empty()) {
        const size_t i = size_t(rng() % order.size());
        const int32_t b = order[i];
        order[i] = order.back();
        order.pop_back();
        a.free(b);
        held.erase(b);
      }
      expect_consistent(a, held);
    }
    for (int32_t b : order) a.free(b);
    EXPECT_EQ(a.num_used(), 0) << "seed " << seed;
    EXPECT_EQ(a.num_free(), total);
  }
}

TEST(BlockAllocator, DoubleFreeAndUnknownPagesThrowTypedErrors) {
  BlockAllocator a(4);
  const int32_t b = *a.allocate();
  a.free(b);
  EXPECT_THROW(a.free(b), metrale::InvalidArgument);  // already free
  EXPECT_THROW(a.free(-1), metrale::InvalidArgument);
  EXPECT_THROW(a.free(4), metrale::InvalidArgument);
  EXPECT_THROW(a.free(3), metrale::InvalidArgument);  // never handed out
  try {
    a.free(b);
    FAIL() << "no throw";
  } catch (const metrale::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'block'"), std::string::npos) << e.what();
  }
  // A failed free changes nothing.
  EXPECT_EQ(a.num_free(), 4);
  EXPECT_THROW(BlockAllocator(-1), metrale::InvalidArgument);
  BlockAllocator empty(0);
  EXPECT_FALSE(empty.allocate().has_value());
}

TEST(BlockAllocator, SharedPagesReturnWithTheirLastHolder) {
  BlockAllocator a(3);
  const int32_t b = *a.allocate();
  a.share(b);
  a.share(b);
  EXPECT_EQ(a.ref_count(b), 3);
  EXPECT_FALSE(a.free(b));
  EXPECT_FALSE(a.free(b));
  EXPECT_TRUE(a.is_used(b));
  EXPECT_EQ(a.num_used(), 1);
  EXPECT_TRUE(a.free(b));
  EXPECT_EQ(a.ref_count(b), 0);
  EXPECT_EQ(a.num_free(), 3);
  EXPECT_THROW(a.share(b), metrale::InvalidArgument);  // a free page cannot be shared
  EXPECT_EQ(a.ref_count(7), -1);
}

TEST(BlockAllocator, WritableCopiesASharedPageOnly) {
  BlockAllocator a(2);
  const int32_t b = *a.allocate();
  EXPECT_EQ(a.writable(b), b);  // one holder: written in place
  a.share(b);
  const std::optional<int32_t> c = a.writable(b);  // two holders: the caller moves to a fresh page
  ASSERT_TRUE(c.has_value());
  EXPECT_NE(*c, b);
  EXPECT_EQ(a.ref_count(b), 1);
  EXPECT_EQ(a.ref_count(*c), 1);
  a.share(*c);
  EXPECT_FALSE(a.writable(*c).has_value());  // no page free: the reference stays
  EXPECT_EQ(a.ref_count(*c), 2);
  EXPECT_THROW(a.writable(-3), metrale::InvalidArgument);
}

// Random allocations, shares, frees and copy-on-writes against a model of the
// holders of each page.
TEST(BlockAllocator, RandomizedSharingKeepsCounts) {
  for (uint64_t seed : {11u, 12u, 13u}) {
    std::mt19937_64 rng(seed);
    const int32_t total = int32_t(1 + rng() % 64);
    BlockAllocator a(total);
    std::vector<int32_t> refs;  // one entry per reference held outside
    for (int op = 0; op < 20000; ++op) {
      const int kind = int(rng() % 4);
      if (kind == 0) {
        const std::optional<int32_t> b = a.allocate();
        std::set<int32_t> distinct(refs.begin(), refs.end());
        ASSERT_EQ(b.has_value(), int32_t(distinct.size()) < total) << "seed " << seed;
        if (b) {
          ASSERT_EQ(distinct.count(*b), 0u) << "page " << *b << " handed out while held";
          refs.push_back(*b);
        }
      } else if (refs.empty()) {
        continue;
      } else {
        const size_t i = size_t(rng() % refs.size());
        const int32_t b = refs[i];
        if (kind == 1) {
          a.share(b);
          refs.push_back(b);
        } else if (kind == 2) {
          const int32_t held = int32_t(std::count(refs.begin(), refs.end(), b));
          ASSERT_EQ(a.free(b), held == 1);
          refs[i] = refs.back();
          refs.pop_back();
        } else {
          const std::optional<int32_t> w = a.writable(b);
          if (w) refs[i] = *w;
        }
      }
      std::map<int32_t, int32_t> count;
      for (int32_t b : refs) ++count[b];
      ASSERT_EQ(a.num_used(), int32_t(count.size()));
      for (const auto& [b, n] : count) ASSERT_EQ(a.ref_count(b), n) << "page " << b << ", seed " << seed;
    }
  }
}

}  // namespace

#if __has_include("serve_sim.hpp")  // apps/ is built (METRALE_BUILD_APPS)
#include "backend.hpp"
#include "metrale/cuda.hpp"
#include "serve_sim.hpp"

namespace {

TEST(ServeSim, ShortRunIsFiniteAndReturnsEveryPage) {
  metrale::cli::ServeSimConfig c;
  c.shape.num_q_heads = 8;
  c.shape.num_kv_heads = 2;
  c.shape.head_dim = 64;
  c.budget_mib = 0.25;
  c.num_requests = 12;
  c.prompt_min = 8;
  c.prompt_max = 60;
  c.output_min = 4;
  c.output_max = 24;
  for (metrale::KvFormat f : {metrale::KvFormat::bf16, metrale::KvFormat::fp8_e4m3, metrale::KvFormat::nvfp4}) {
    SCOPED_TRACE(metrale::to_string(f));
    const metrale::cli::ServeSimResult r = metrale::cli::run_serve_sim(c, f, *metrale::cli::make_cpu_backend());
    EXPECT_EQ(r.finished + r.rejected, c.num_requests);
    EXPECT_EQ(r.rejected, 0);
    EXPECT_GT(r.decode_tokens, 0);
    EXPECT_EQ(r.nonfinite, 0);
    EXPECT_EQ(r.final_used_blocks, 0);
    EXPECT_LE(r.peak_used_blocks, r.num_blocks);
    EXPECT_GE(r.peak_seqs, 1);
  }
}

TEST(ServeSim, SmallerFormatsHoldMoreSequencesInTheSameBudget) {
  metrale::cli::ServeSimConfig c;
  c.shape.num_q_heads = 8;
  c.shape.num_kv_heads = 2;
  c.shape.head_dim = 64;
  c.budget_mib = 0.5;
  c.num_requests = 24;
  c.arrival_rate = 4.0;
  const auto cpu = metrale::cli::make_cpu_backend();
  const auto bf16 = metrale::cli::run_serve_sim(c, metrale::KvFormat::bf16, *cpu);
  const auto nvfp4 = metrale::cli::run_serve_sim(c, metrale::KvFormat::nvfp4, *cpu);
  EXPECT_GT(nvfp4.num_blocks, 3 * bf16.num_blocks);
  EXPECT_GT(nvfp4.peak_seqs, bf16.peak_seqs);
  EXPECT_LT(nvfp4.steps, bf16.steps);
}

// The schedule depends only on the request stream and the budget, so the
// CUDA backend must reproduce the CPU run step for step, with finite outputs.
TEST(ServeSim, GpuRunSchedulesLikeTheCpuRun) {
  if (!metrale::cuda::available()) GTEST_SKIP() << "no sm_90 GPU";
  metrale::cli::ServeSimConfig c;
  c.budget_mib = 1.0;
  c.num_requests = 10;
  c.prompt_max = 100;
  c.output_max = 40;
  const auto cpu_be = metrale::cli::make_cpu_backend(), cuda_be = metrale::cli::make_cuda_backend();
  for (metrale::KvFormat f : {metrale::KvFormat::bf16, metrale::KvFormat::fp8_e4m3, metrale::KvFormat::nvfp4}) {
    SCOPED_TRACE(metrale::to_string(f));
    const auto cpu = metrale::cli::run_serve_sim(c, f, *cpu_be);
    const auto gpu = metrale::cli::run_serve_sim(c, f, *cuda_be);
    EXPECT_EQ(gpu.steps, cpu.steps);
    EXPECT_EQ(gpu.decode_tokens, cpu.decode_tokens);
    EXPECT_EQ(gpu.preemptions, cpu.preemptions);
    EXPECT_EQ(gpu.peak_used_blocks, cpu.peak_used_blocks);
    EXPECT_EQ(gpu.nonfinite, 0);
    EXPECT_EQ(gpu.final_used_blocks, 0);
  }
}

TEST(ServeSim, RejectsABudgetWithoutAPage) {
  metrale::cli::ServeSimConfig c;
  c.budget_mib = 1e-6;
  EXPECT_THROW(metrale::cli::run_serve_sim(c, metrale::KvFormat::bf16, *metrale::cli::make_cpu_backend()),
               std::invalid_argument);
}

}  // namespace

#else
TEST(ServeSim, NeedsTheApps) { GTEST_SKIP() << "apps/ not built (METRALE_BUILD_APPS=OFF)"; }
#endif
