// Device decode workloads for benchmarks (see decode_workload.hpp).
#include "bench/lib/bench_util.hpp"
#include "bench/lib/decode_workload.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>

#include "metrale/cuda.hpp"
#include "metrale/format.hpp"

namespace metrale::bench {
namespace {

__device__ uint32_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return uint32_t(x);
}

// Roughly normal values (sum of 4 uniforms); channels d % 41 == 7 of K are
// 12x larger, like the outlier channels of real models' keys.
__global__ void random_rows(bf16* out, int64_t n, int32_t row_len, uint64_t seed, bool outliers) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t h = mix(seed * 0x9e3779b97f4a7c15ull + uint64_t(i));
    float v = (float(h & 0xff) + float((h >> 8) & 0xff) + float((h >> 16) & 0xff) + float(h >> 24)) / 255.0f - 2.0f;
    if (outliers && (i % row_len) % 41 == 7) v *= 12.0f;
    out[i] = codec::float_to_bf16(v);
  }
}

}  // namespace

struct DecodeWorkload::Cache {
  void* k = nullptr;
  void* v = nullptr;
  int32_t* tables = nullptr;
  ~Cache() {
    cudaFree(k);
    cudaFree(v);
    cudaFree(tables);
  }
};

std::string DecodeShape::name() const {
  return std::string(to_string(format)) + " " + std::to_string(num_seqs) + "x" + std::to_string(seq_len) +
         (mixed_lengths ? "(mixed)" : "") + " " + std::to_string(num_q_heads) + "/" + std::to_string(num_kv_heads) +
         " d" + std::to_string(head_dim) + (sliding_window ? " w" + std::to_string(sliding_window) : "");
}

DecodeWorkload::DecodeWorkload(const DecodeShape& s, size_t min_rotation_bytes, uint64_t seed) : shape_(s) {
  std::mt19937_64 rng(seed);
  host_lens_.resize(s.num_seqs);
  for (int32_t i = 0; i < s.num_seqs; ++i)
    host_lens_[i] = !s.lengths.empty() ? s.lengths.at(size_t(i))
                    : s.mixed_lengths ? 1 + int32_t(rng() % uint64_t(s.seq_len)) : s.seq_len;
  max_blocks_per_seq_ = (s.seq_len + s.block_size - 1) / s.block_size;
  int64_t pages = 0;
  for (int32_t len : host_lens_) pages += (len + s.block_size - 1) / s.block_size;
  pages = std::max<int64_t>(pages, 1);
  layout_ = KvCacheLayout::make(s.format, pages, s.block_size, s.num_kv_heads, s.head_dim);
  const int n_rep = int(std::clamp<double>(double(min_rotation_bytes) / std::max(attended_bytes(), 1.0) + 1, 1, 64));

  const int32_t row = s.num_kv_heads * s.head_dim;
  const int64_t total_tokens = std::accumulate(host_lens_.begin(), host_lens_.end(), int64_t(0));
  const int64_t chunk = std::min<int64_t>(std::max<int64_t>(total_tokens, 1), 1 << 16);
  bf16 *key = nullptr, *value = nullptr;
  int64_t* slots = nullptr;
  float* absmax = nullptr;
  test::cuda_check(cudaMalloc(&key, chunk * row * sizeof(bf16)), "cudaMalloc(key)");
  test::cuda_check(cudaMalloc(&value, chunk * row * sizeof(bf16)), "cudaMalloc(value)");
  test::cuda_check(cudaMalloc(&slots, chunk * sizeof(int64_t)), "cudaMalloc(slots)");
  test::cuda_check(cudaMalloc(&absmax, 2 * sizeof(float)), "cudaMalloc(absmax)");

  // Scales calibrated on the first chunk of the data, as an engine would.
  random_rows<<<1024, 256>>>(key, chunk * row, row, seed, true);
  random_rows<<<1024, 256>>>(value, chunk * row, row, seed + 1, false);
  test::cuda_check(cudaMemset(absmax, 0, 2 * sizeof(float)), "cudaMemset");
  cuda::bf16_absmax(key, chunk, row, row, absmax);
  cuda::bf16_absmax(value, chunk, row, row, absmax + 1);
  float am[2];
  test::cuda_check(cudaMemcpy(am, absmax, sizeof(am), cudaMemcpyDeviceToHost), "absmax download");
  scales_ = kv_scales_from_absmax(s.format, am[0], am[1]);

  std::vector<int64_t> host_slots(chunk);
  for (int r = 0; r < n_rep; ++r) {
    auto c = std::make_unique<Cache>();
    test::cuda_check(cudaMalloc(&c->k, layout_.cache_bytes()), "cudaMalloc(k cache)");
    test::cuda_check(cudaMalloc(&c->v, layout_.cache_bytes()), "cudaMalloc(v cache)");
    std::vector<int32_t> perm(pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int32_t> tables(int64_t(s.num_seqs) * max_blocks_per_seq_, 0);
    int64_t next = 0;
    for (int32_t i = 0; i < s.num_seqs; ++i)
      for (int32_t p = 0; p < (host_lens_[i] + s.block_size - 1) / s.block_size; ++p)
        tables[int64_t(i) * max_blocks_per_seq_ + p] = perm[next++];
    test::cuda_check(cudaMalloc(&c->tables, tables.size() * sizeof(int32_t)), "cudaMalloc(tables)");
    test::cuda_check(cudaMemcpy(c->tables, tables.data(), tables.size() * sizeof(int32_t), cudaMemcpyHostToDevice), "tables");

    CacheWriteArgs w;
    w.key = key;
    w.value = value;
    w.key_stride = w.value_stride = row;
    w.slot_mapping = slots;
    w.cache = KvCacheView{layout_, c->k, c->v, scales_};
    int32_t seq = 0, pos = 0;
    for (int64_t done = 0, ci = 0; done < total_tokens; ++ci) {
      const int64_t n = std::min(chunk, total_tokens - done);
      for (int64_t t = 0; t < n; ++t) {
        while (pos >= host_lens_[seq]) ++seq, pos = 0;
        host_slots[t] = int64_t(tables[int64_t(seq) * max_blocks_per_seq_ + pos / s.block_size]) * s.block_size +
                        pos % s.block_size;
        ++pos;
      }
      random_rows<<<1024, 256>>>(key, n * row, row, seed + 2 * (ci + 1) + 1000 * r, true);
      random_rows<<<1024, 256>>>(value, n * row, row, seed + 2 * (ci + 1) + 1 + 1000 * r, false);
      test::cuda_check(cudaMemcpy(slots, host_slots.data(), n * sizeof(int64_t), cudaMemcpyHostToDevice), "slots");
      w.num_tokens = n;
      cuda::reshape_and_cache(w);
      done += n;
    }
    caches_.push_back(std::move(c));
  }
  const int64_t q_elems = int64_t(s.num_seqs) * s.num_q_heads * s.head_dim;
  test::cuda_check(cudaMalloc(&q_, q_elems * sizeof(bf16)), "cudaMalloc(q)");
  random_rows<<<1024, 256>>>(q_, q_elems, s.num_q_heads * s.head_dim, seed + 7, false);
  test::cuda_check(cudaMalloc(&seq_lens_, s.num_seqs * sizeof(int32_t)), "cudaMalloc(seq_lens)");
  test::cuda_check(cudaMemcpy(seq_lens_, host_lens_.data(), s.num_seqs * sizeof(int32_t), cudaMemcpyHostToDevice), "lens");
  test::cuda_check(cudaDeviceSynchronize(), "workload setup");
  cudaFree(key);
  cudaFree(value);
  cudaFree(slots);
  cudaFree(absmax);
}

void random_bf16(bf16* device, int64_t n, int32_t row_len, uint64_t seed) {
  random_rows<<<1024, 256>>>(device, n, row_len, seed, false);
  test::cuda_check(cudaGetLastError(), "random_rows");
}

AttnArgs DecodeWorkload::runs_args(int replica, bf16* out, const bf16* q, int64_t q_stride,
                                        const int32_t* q_start, int32_t num_q_rows) const {
  AttnArgs a = args(replica, out);
  a.q = q;
  a.q_stride = q_stride;
  a.q_start = q_start;
  a.num_q_rows = num_q_rows;
  return a;
}

DecodeWorkload::~DecodeWorkload() {
  cudaFree(q_);
  cudaFree(seq_lens_);
}

AttnArgs DecodeWorkload::args(int replica, bf16* out) const {
  const Cache& c = *caches_[replica % caches_.size()];
  AttnArgs a;
  a.q = q_;
  a.q_stride = int64_t(shape_.num_q_heads) * shape_.head_dim;
  a.num_seqs = shape_.num_seqs;
  a.num_q_heads = shape_.num_q_heads;
  a.cache = KvCacheView{layout_, c.k, c.v, scales_};
  a.block_tables = c.tables;
  a.max_blocks_per_seq = max_blocks_per_seq_;
  a.seq_lens = seq_lens_;
  a.sliding_window = shape_.sliding_window;
  a.sm_scale = 1.0f / std::sqrt(float(shape_.head_dim));
  a.out = out;
  return a;
}

double DecodeWorkload::attended_bytes() const {
  double tokens = 0;
  for (int32_t len : host_lens_)
    tokens += shape_.sliding_window > 0 ? std::min(len, shape_.sliding_window) : len;
  return tokens * layout_.kv_bytes_per_token();
}

int32_t DecodeWorkload::max_seq_len() const { return *std::max_element(host_lens_.begin(), host_lens_.end()); }

DecodeWorkload::HostCopy DecodeWorkload::download_replica0() const {
  HostCopy h;
  const Cache& c = *caches_[0];
  h.k.resize(layout_.cache_bytes());
  h.v.resize(layout_.cache_bytes());
  h.block_tables.resize(int64_t(shape_.num_seqs) * max_blocks_per_seq_);
  h.seq_lens = host_lens_;
  h.q.resize(int64_t(shape_.num_seqs) * shape_.num_q_heads * shape_.head_dim);
  test::cuda_check(cudaMemcpy(h.k.data(), c.k, h.k.size(), cudaMemcpyDeviceToHost), "download k");
  test::cuda_check(cudaMemcpy(h.v.data(), c.v, h.v.size(), cudaMemcpyDeviceToHost), "download v");
  test::cuda_check(cudaMemcpy(h.block_tables.data(), c.tables, h.block_tables.size() * 4, cudaMemcpyDeviceToHost), "tables");
  test::cuda_check(cudaMemcpy(h.q.data(), q_, h.q.size() * sizeof(bf16), cudaMemcpyDeviceToHost), "download q");
  return h;
}

}  // namespace metrale::bench
