// cp_bench: context-parallel decode over N GPUs of one host,
// through NCCL. Per format and shape it reports the decode step on 1 GPU (the
// planner's single-GPU run) vs the same batch context-sharded over N GPUs,
// the speedup and scaling efficiency t1 / (N * tN), and the all-gather of the
// (o, m, l) records timed on its own.
//
// Process model: ONE process drives the N GPUs, one host thread per GPU
// (each with its own stream and communicator from ncclCommInitAll). The
// library's model is one process per GPU; a thread per GPU issues exactly the
// same per-rank work (the rank's split-K pass, ncclAllGather, the merge) and
// needs no launcher (mpirun/torchrun), so the benchmark runs as a plain
// program. Each rank's step is captured into a CUDA graph (NCCL supports
// stream capture) and replayed, as a serving engine replays its decode step;
// --no-graph times plain launches instead.
//
// Shards: contiguous, equal token counts per rank (the context length is a
// multiple of N pages for the default shapes); each GPU holds only its own
// pages (a DecodeWorkload of the shard length), so memory scales down too.
// No sliding window (the window edge pass is exercised by the tests).
//
//   cp_bench [--gpus N] [--formats bf16,nvfp4] [--shapes 1x524288,8x131072]
//            [--reps 20] [--no-graph]
// NCCL_NVLS_ENABLE is set to 0 unless the environment sets it (NVLink
// multicast stays off on the shared machines).
#include <cuda_runtime.h>
#include <nccl.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench/lib/bench_util.hpp"
#include "bench/lib/decode_workload.hpp"
#include "bench/lib/gpu_timing.hpp"
#include "metrale/context_parallel.hpp"
#include "metrale/cuda.hpp"
#include "metrale/plan.hpp"

namespace {

using namespace metrale;
using metrale::bench::DecodeShape;
using metrale::bench::DecodeWorkload;
using metrale::bench::kRotationBytes;
constexpr auto& cuda_ok = metrale::test::cuda_check;  // testing/cuda_check.hpp
using metrale::bench::split_list;

void nccl_ok(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(r));
}

class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lk(mu_);
    const int gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lk, [&] { return gen != gen_; });
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_, count_ = 0, gen_ = 0;
};

// Median microseconds per call of enqueue(call, stream) on the current
// device: `per_graph` calls captured into one graph (or launched plainly),
// `reps` timed repetitions. `sync` runs between repetitions so that all ranks
// start each repetition together (collectives would otherwise time skew).
double time_rank(const std::function<void(int, cudaStream_t)>& enqueue, cudaStream_t st, int per_graph, int reps,
                 bool graph, Barrier& sync) {
  cudaGraphExec_t exec = nullptr;
  if (graph) {
    // One plain call first: NCCL sets up its connections lazily on a
    // communicator's first collective, which cannot happen inside a capture.
    enqueue(0, st);
    cuda_ok(cudaStreamSynchronize(st), "pre-capture run");
    sync.wait();
    cudaGraph_t g = nullptr;
    cuda_ok(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    for (int i = 0; i < per_graph; ++i) enqueue(i, st);
    cuda_ok(cudaStreamEndCapture(st, &g), "cudaStreamEndCapture");
    cuda_ok(cudaGraphInstantiate(&exec, g, 0), "cudaGraphInstantiate");
    cuda_ok(cudaGraphDestroy(g), "cudaGraphDestroy");
  }
  auto run_once = [&] {
    if (graph) {
      cuda_ok(cudaGraphLaunch(exec, st), "cudaGraphLaunch");
    } else {
      for (int i = 0; i < per_graph; ++i) enqueue(i, st);
    }
  };
  cudaEvent_t a, b;
  cuda_ok(cudaEventCreate(&a), "cudaEventCreate");
  cuda_ok(cudaEventCreate(&b), "cudaEventCreate");
  for (int w = 0; w < 2; ++w) run_once();  // warm-up (also NCCL's lazy connection setup)
  cuda_ok(cudaStreamSynchronize(st), "warm-up");
  std::vector<double> us;
  for (int r = 0; r < reps; ++r) {
    sync.wait();
    cuda_ok(cudaEventRecord(a, st), "cudaEventRecord");
    run_once();
    cuda_ok(cudaEventRecord(b, st), "cudaEventRecord");
    cuda_ok(cudaEventSynchronize(b), "cudaEventSynchronize");
    float ms = 0;
    cuda_ok(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
    us.push_back(1e3 * ms / per_graph);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  if (exec) cudaGraphExecDestroy(exec);
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

struct RankResult {
  double step_us = 0, gather_us = 0, local_us = 0;
  int32_t splits = 0;
  std::string error;
};

}  // namespace

int main(int argc, char** argv) {
  int gpus = 0, reps = 20;
  bool no_graph = false;
  std::string formats = "bf16,nvfp4", shapes = "1x524288,8x131072";
  CLI::App app{"cp_bench: context-parallel decode over N GPUs against one GPU"};
  app.add_option("--gpus", gpus, "GPUs to use (0 = all)")->check(CLI::NonNegativeNumber);
  app.add_option("--formats", formats, "comma list of bf16, fp8, nvfp4");
  app.add_option("--shapes", shapes, "comma list of BATCHxCONTEXT");
  app.add_option("--reps", reps, "timed replays")->check(CLI::PositiveNumber);
  app.add_flag("--no-graph", no_graph, "plain launches instead of CUDA-graph replay");
  CLI11_PARSE(app, argc, argv);
  const bool graph = !no_graph;
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);

  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1 || !cuda::available()) {
    std::fprintf(stderr, "cp_bench: no sm_90 GPU here; nothing to measure\n");
    return 2;
  }
  const int N = gpus > 0 ? std::min(gpus, count) : count;
  std::vector<int> devs(static_cast<size_t>(N));
  for (int r = 0; r < N; ++r) devs[size_t(r)] = r;
  std::vector<ncclComm_t> comms(static_cast<size_t>(N));
  nccl_ok(ncclCommInitAll(comms.data(), N, devs.data()), "ncclCommInitAll");
  cuda_ok(cudaSetDevice(0), "cudaSetDevice");
  const cuda::DeviceInfo dev = cuda::device_info();
  std::printf("# cp_bench: %d x %s (%d SMs), NCCL %d, NCCL_NVLS_ENABLE=%s, %s, one host thread per GPU\n", N,
              dev.name.c_str(), dev.num_sms, NCCL_VERSION_CODE, std::getenv("NCCL_NVLS_ENABLE"),
              graph ? "graph replay" : "plain launches");
  std::printf("%-8s %-12s %6s %10s %10s %8s %8s %10s %10s %12s %10s\n", "format", "shape", "gpus", "t1_us", "tN_us",
              "speedup", "eff", "local_us", "gather_us", "gather_KiB", "splits/r");

  const int32_t qh = 32, kvh = 8, hd = 128, bs = 16;
  for (const std::string& fs : split_list(formats)) {
    for (const std::string& sh : split_list(shapes)) {
      DecodeShape s;
      s.format = kv_format_from_string(fs);
      if (std::sscanf(sh.c_str(), "%dx%d", &s.num_seqs, &s.seq_len) != 2)
        throw std::runtime_error("bad shape " + sh);
      s.num_q_heads = qh;
      s.num_kv_heads = kvh;
      s.head_dim = hd;
      s.block_size = bs;

      // ---- 1 GPU: the whole batch, planner's choice ----
      double t1 = 0;
      {
        cuda_ok(cudaSetDevice(0), "cudaSetDevice");
        DecodeWorkload w(s, kRotationBytes, 1234);
        const AttnPlan plan = plan_attention(attention_problem(w.args(0, nullptr), w.max_seq_len()), cuda::attention_target());
        bf16* out = nullptr;
        float* ws = nullptr;
        cuda_ok(cudaMalloc(&out, size_t(s.num_seqs) * qh * hd * sizeof(bf16)), "cudaMalloc(out)");
        cuda_ok(cudaMalloc(&ws, std::max<size_t>(plan.workspace_bytes, 16)), "cudaMalloc(ws)");
        const int per_graph = std::max(w.replicas(), std::min(20, 4 * w.replicas()));
        t1 = metrale::bench::median_us_per_call(
            [&](int call, cudaStream_t st) {
              cuda::run_attention(plan, w.args(call % w.replicas(), out),
                               SplitKWorkspace{ws, plan.workspace_bytes, plan.num_splits}, st);
            },
            per_graph);
        cudaFree(out);
        cudaFree(ws);
      }

      // ---- N GPUs: each rank holds seq_len / N tokens of every sequence ----
      const int32_t pages = (s.seq_len + bs - 1) / bs;
      const int32_t per_rank_pages = (pages + N - 1) / N;
      std::vector<RankResult> res(static_cast<size_t>(N));
      Barrier sync(N);
      size_t gather_bytes = 0;
      std::vector<std::thread> threads;
      for (int r = 0; r < N; ++r) {
        threads.emplace_back([&, r] {
          RankResult& out_r = res[size_t(r)];
          try {
            cuda_ok(cudaSetDevice(r), "cudaSetDevice");
            DecodeShape local = s;
            // contiguous shard: ranks 0..N-2 get per_rank_pages pages, the last the rest (>= 1 page here)
            const int32_t my_pages = std::max(1, std::min(per_rank_pages, pages - r * per_rank_pages));
            local.seq_len = std::min(s.seq_len - r * per_rank_pages * bs, my_pages * bs);
            local.seq_len = std::max(local.seq_len, 1);
            DecodeWorkload w(local, kRotationBytes, 777 + uint64_t(r));
            const AttnArgs a0 = w.args(0, nullptr);
            const int32_t ns =
                std::min(plan_attention(attention_problem(a0, w.max_seq_len()), cuda::attention_target()).num_splits,
                         kMaxSplits / N);
            const cp::CpLayout L = cp::make_layout(N, a0, ns, /*has_edge=*/false);
            out_r.splits = ns;
            if (r == 0) gather_bytes = L.rank_floats() * sizeof(float) * size_t(N);
            float *gathered = nullptr, *merged = nullptr;
            bf16* out = nullptr;
            cuda_ok(cudaMalloc(&gathered, L.gathered_floats() * sizeof(float)), "cudaMalloc(gathered)");
            cuda_ok(cudaMalloc(&merged, L.merged_floats() * sizeof(float)), "cudaMalloc(merged)");
            cuda_ok(cudaMalloc(&out, size_t(s.num_seqs) * qh * hd * sizeof(bf16)), "cudaMalloc(out)");
            cuda_ok(cudaMemset(gathered, 0, L.gathered_floats() * sizeof(float)), "cudaMemset");
            cudaStream_t st;
            cuda_ok(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate");
            const int per_graph = std::max(w.replicas(), std::min(20, 4 * w.replicas()));
            ncclComm* comm = comms[size_t(r)];
            // full step: rank states -> all-gather -> merge
            out_r.step_us = time_rank(
                [&](int call, cudaStream_t stream) {
                  nccl::cp_decode(L, r, w.args(call % w.replicas(), out), nullptr, gathered, merged, comm, stream);
                },
                st, per_graph, reps, graph, sync);
            // the exchange alone
            out_r.gather_us = time_rank(
                [&](int, cudaStream_t stream) { nccl::cp_all_gather(L, r, gathered, comm, stream); }, st, per_graph,
                reps, graph, sync);
            // local work alone (no exchange): rank states + merge
            out_r.local_us = time_rank(
                [&](int call, cudaStream_t stream) {
                  cuda::cp_rank_states(L, w.args(call % w.replicas(), out), nullptr,
                                       gathered + size_t(r) * L.rank_floats(), stream);
                  cuda::cp_merge(L, gathered, merged, out, stream);
                },
                st, per_graph, reps, graph, sync);
            cuda_ok(cudaStreamSynchronize(st), "sync");
            cudaStreamDestroy(st);
            cudaFree(gathered);
            cudaFree(merged);
            cudaFree(out);
          } catch (const std::exception& e) {
            out_r.error = e.what();
            std::fprintf(stderr, "cp_bench: rank %d: %s\n", r, e.what());
            std::fflush(stderr);
            std::abort();  // the other ranks would wait in a collective forever
          }
        });
      }
      for (auto& t : threads) t.join();
      double tN = 0, gather = 0, local = 0;
      for (const RankResult& x : res) {
        tN = std::max(tN, x.step_us);
        gather = std::max(gather, x.gather_us);
        local = std::max(local, x.local_us);
      }
      std::printf("%-8s %-12s %6d %10.1f %10.1f %8.2f %7.0f%% %10.1f %10.1f %12.1f %10d\n", fs.c_str(), sh.c_str(), N,
                  t1, tN, t1 / tN, 100.0 * t1 / (N * tN), local, gather, gather_bytes / 1024.0, res[0].splits);
      std::fflush(stdout);
    }
  }
  for (ncclComm_t c : comms) ncclCommDestroy(c);
  return 0;
}
