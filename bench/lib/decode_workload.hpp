// A decode benchmark workload on the device: paged K/V caches of one format
// filled through cuda::reshape_and_cache from random bf16 rows with a few
// large-magnitude K channels, block tables over shuffled pages, q, lengths.
// Enough replicas are built that cycling through them reads more than the
// L2 holds, so timings measure HBM, not cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "metrale/cache.hpp"
#include "metrale/ops.hpp"

namespace metrale::bench {

// Bytes of cache replicas a timed workload rotates through: > 8x the
// H200's 60 MB L2, so replays read HBM, not L2.
constexpr size_t kRotationBytes = size_t(512) << 20;

struct DecodeShape {
  KvFormat format = KvFormat::bf16;
  int32_t num_seqs = 1;
  int32_t seq_len = 1024;        // every sequence has this length unless `mixed_lengths`
  bool mixed_lengths = false;    // lengths uniform in [1, seq_len] (deterministic)
  std::vector<int32_t> lengths;  // else, if given: num_seqs explicit lengths, each <= seq_len
  int32_t num_q_heads = 32;
  int32_t num_kv_heads = 8;
  int32_t head_dim = 128;
  int32_t block_size = 16;
  int32_t sliding_window = 0;
  std::string name() const;      // e.g. "bf16 64x4096 32/8 d128"
};

// Roughly normal bf16 values (the workload's own q and V generator) into
// `n` elements of device memory, rows of `row_len`.
void random_bf16(bf16* device, int64_t n, int32_t row_len, uint64_t seed);

class DecodeWorkload {
 public:
  // `min_rotation_bytes`: the replicas together hold at least this many
  // attended bytes (ignored when one replica is already larger).
  DecodeWorkload(const DecodeShape& shape, size_t min_rotation_bytes, uint64_t seed);
  ~DecodeWorkload();
  DecodeWorkload(const DecodeWorkload&) = delete;
  DecodeWorkload& operator=(const DecodeWorkload&) = delete;

  const DecodeShape& shape() const { return shape_; }
  int replicas() const { return int(caches_.size()); }
  // Device arguments of replica r; `out` is a device [num_seqs, q_heads, D] bf16 buffer.
  AttnArgs args(int replica, bf16* out) const;
  // The same cache as query runs: rows q_start[i] .. q_start[i+1] of `q`
  // (device, q_stride elements per row) for sequence i, `out` [num_q_rows, q_heads, D].
  AttnArgs runs_args(int replica, bf16* out, const bf16* q, int64_t q_stride, const int32_t* q_start,
                          int32_t num_q_rows) const;
  // Bytes of K, V and scales in the attended range of one replica.
  double attended_bytes() const;
  int32_t max_seq_len() const;

  // Host copies of replica 0 (for check mode): caches, tables, lengths, q.
  struct HostCopy {
    std::vector<uint8_t> k, v;
    std::vector<int32_t> block_tables, seq_lens;
    std::vector<bf16> q;
  };
  HostCopy download_replica0() const;

 private:
  struct Cache;
  DecodeShape shape_;
  KvCacheLayout layout_;
  KvScales scales_;
  int32_t max_blocks_per_seq_ = 0;
  std::vector<std::unique_ptr<Cache>> caches_;
  bf16* q_ = nullptr;
  int32_t* seq_lens_ = nullptr;
  std::vector<int32_t> host_lens_;
};

}  // namespace metrale::bench
