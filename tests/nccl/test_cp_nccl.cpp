// Context-parallel decode through real NCCL (metrale_nccl): one host thread
// per GPU, a communicator from ncclCommInitAll over every visible GPU (R =
// device count, so R = 1 on a one-GPU machine: the NCCL path is still
// exercised), every rank holding a copy of the cache and its shard's tables,
// nccl::cp_decode on each rank, and every rank's output compared with the
// float64 reference. Skipped without an sm_90 GPU. Built only when NCCL is
// found (tests/CMakeLists.txt); not part of the core test glob.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "metrale/context_parallel.hpp"
#include "support/device_problem.hpp"
#include "support/problem.hpp"
#include "testing/reference.hpp"

namespace metrale::test {
namespace {

struct RankOut {
  std::vector<bf16> out;
  std::string error;
};

TEST(ContextParallelNccl, EveryRankGetsTheFullOutput) {
  METRALE_SKIP_WITHOUT_GPU();
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  int R = 0;
  METRALE_CUDA_OK(cudaGetDeviceCount(&R));
  std::vector<int> devs;
  for (int r = 0; r < R; ++r) devs.push_back(r);
  std::vector<ncclComm_t> comms(devs.size());
  ASSERT_EQ(ncclCommInitAll(comms.data(), R, devs.data()), ncclSuccess);
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + ", ranks " + std::to_string(R));
  int iter = 0;
  for (KvFormat f : {KvFormat::bf16, KvFormat::fp8_e4m3, KvFormat::nvfp4})
    for (int32_t W : {0, 37})
      for (cp::Sharding kind : {cp::Sharding::contiguous, cp::Sharding::interleaved})
        for (int32_t ns : {1, 3}) {
          DecodeCase c;
          c.format = f;
          c.num_kv_heads = 2;
          c.group = 4;
          c.seq_lens = {0, 1, 17, 100, 1000, 5000};
          c.sliding_window = W;
          const HostProblem hp = make_problem(c, seed + uint64_t(iter++));
          const std::vector<double> ref = reference_attention(hp);
          const cp::ShardSpec spec{kind, R, 0};
          std::vector<RankOut> outs(devs.size());
          std::vector<std::thread> threads;
          for (int r = 0; r < R; ++r)
            threads.emplace_back([&, r] {
              try {
                METRALE_CUDA_OK(cudaSetDevice(r));
                DeviceProblem dp(hp);
                dp.poison_out();
                const AttnArgs global = dp.args();
                const cp::RankShard s = cp::make_rank_shard(spec, r, hp.block_tables.data(), hp.max_blocks_per_seq,
                                                            hp.seq_lens.data(), hp.num_seqs(), c.block_size, W);
                DeviceBuffer<int32_t> tables(s.block_tables), lens(s.seq_lens);
                DeviceBuffer<cp::EdgeSlice> edges(s.edges);
                const cp::CpLayout L = cp::make_layout(R, global, ns, s.has_edge);
                DeviceBuffer<float> gathered(L.gathered_floats()), merged(L.merged_floats());
                cudaStream_t st;
                METRALE_CUDA_OK(cudaStreamCreate(&st));
                nccl::cp_decode(L, r, cp::rank_attn_args(global, s, tables.get(), lens.get()), edges.get(),
                                gathered.get(), merged.get(), comms[size_t(r)], st);
                METRALE_CUDA_OK(cudaStreamSynchronize(st));
                METRALE_CUDA_OK(cudaStreamDestroy(st));
                outs[size_t(r)].out = dp.download_out();
              } catch (const std::exception& e) {
                outs[size_t(r)].error = e.what();
              }
            });
          for (auto& t : threads) t.join();
          for (int r = 0; r < R; ++r) {
            const std::string what = std::string(to_string(f)) + " W=" + std::to_string(W) +
                                     (kind == cp::Sharding::contiguous ? " contiguous" : " interleaved") +
                                     " splits/rank=" + std::to_string(ns) + " rank " + std::to_string(r);
            ASSERT_TRUE(outs[size_t(r)].error.empty()) << what << ": " << outs[size_t(r)].error;
            const Comparison cmp =
                compare_decode(outs[size_t(r)].out.data(), ref, hp.num_seqs(), hp.num_q_heads(), c.head_dim);
            EXPECT_TRUE(cmp.ok) << what << ": " << cmp.report;
          }
        }
  for (ncclComm_t cm : comms) ncclCommDestroy(cm);
}

}  // namespace
}  // namespace metrale::test
