// A HostProblem mirrored on the device: caches, q, tables and lengths, each
// inside guard regions (testing/device_buffer.hpp), plus a poisoned output.
// GPU tests build one, run a kernel on args(), and compare download_out()
// with the float64 reference. Every GPU test starts with
// METRALE_SKIP_WITHOUT_GPU(), so it reports "skipped" (never "passed") on
// machines without a GPU.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "metrale/cuda.hpp"
#include "support/problem.hpp"
#include "testing/device_buffer.hpp"

#define METRALE_SKIP_WITHOUT_GPU()                                                  \
  do {                                                                              \
    if (!::metrale::cuda::available()) GTEST_SKIP() << "no sm_90 CUDA device here"; \
  } while (0)

namespace metrale::test {

class DeviceProblem {
 public:
  explicit DeviceProblem(const HostProblem& p)
      : host_(p), k_(p.k_cache), v_(p.v_cache), q_(p.q), tables_(p.block_tables), lens_(p.seq_lens),
        out_(p.out_elems()) {}

  AttnArgs args() { return host_.device_args(q_.get(), k_.get(), v_.get(), tables_.get(), lens_.get(), out_.get()); }
  void poison_out() { out_.fill_bytes(0xFF); }
  std::vector<bf16> download_out() const { return out_.download(); }
  // No kernel wrote around any buffer, and the read-only inputs are unchanged.
  bool inputs_intact() const {
    return k_.guards_intact() && v_.guards_intact() && q_.guards_intact() && tables_.guards_intact() &&
           lens_.guards_intact() && k_.download() == host_.k_cache && v_.download() == host_.v_cache;
  }
  bool out_guards_intact() const { return out_.guards_intact(); }

 private:
  const HostProblem& host_;
  DeviceBuffer<uint8_t> k_, v_;
  DeviceBuffer<bf16> q_;
  DeviceBuffer<int32_t> tables_, lens_;
  DeviceBuffer<bf16> out_;
};

}  // namespace metrale::test
