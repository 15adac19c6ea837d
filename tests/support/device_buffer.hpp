// Device memory for GPU tests: RAII buffers with poisoned guard regions on
// both sides, so a kernel's stray write is caught, and a skip macro that makes
// GPU tests report "skipped" (never "passed") on machines without a GPU.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "metrale/cuda.hpp"

#define METRALE_SKIP_WITHOUT_GPU()                                                  \
  do {                                                                              \
    if (!::metrale::cuda::available()) GTEST_SKIP() << "no sm_90 CUDA device here"; \
  } while (0)

#define METRALE_CUDA_OK(expr)                                                                      \
  do {                                                                                             \
    cudaError_t e_ = (expr);                                                                       \
    if (e_ != cudaSuccess) throw std::runtime_error(std::string(#expr) + ": " + cudaGetErrorString(e_)); \
  } while (0)

namespace metrale::test {

constexpr size_t kGuardBytes = 4096;   // each side; multiple of 256 keeps the payload aligned
constexpr uint8_t kGuardByte = 0xA5;   // pattern no kernel writes by accident

// `count` elements of T between two guard regions. The payload starts
// poisoned with `poison` bytes (0xFF makes bf16/f32 a NaN).
template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t count, uint8_t poison = 0xFF) : count_(count) {
    METRALE_CUDA_OK(cudaMalloc(&base_, bytes() + 2 * kGuardBytes));
    METRALE_CUDA_OK(cudaMemset(base_, kGuardByte, kGuardBytes));
    METRALE_CUDA_OK(cudaMemset(base_ + kGuardBytes + bytes(), kGuardByte, kGuardBytes));
    fill_bytes(poison);
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(base_); }

  T* get() const { return reinterpret_cast<T*>(base_ + kGuardBytes); }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }

  void fill_bytes(uint8_t b) {
    if (bytes()) METRALE_CUDA_OK(cudaMemset(get(), b, bytes()));
  }
  void upload(const std::vector<T>& host) {
    if (host.size() != count_) throw std::runtime_error("DeviceBuffer::upload: size mismatch");
    if (bytes()) METRALE_CUDA_OK(cudaMemcpy(get(), host.data(), bytes(), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(count_);
    METRALE_CUDA_OK(cudaDeviceSynchronize());
    if (bytes()) METRALE_CUDA_OK(cudaMemcpy(host.data(), get(), bytes(), cudaMemcpyDeviceToHost));
    return host;
  }
  // True when neither guard region was touched.
  bool guards_intact() const {
    std::vector<uint8_t> g(kGuardBytes);
    for (const uint8_t* p : {base_, base_ + kGuardBytes + bytes()}) {
      METRALE_CUDA_OK(cudaMemcpy(g.data(), p, kGuardBytes, cudaMemcpyDeviceToHost));
      for (uint8_t b : g)
        if (b != kGuardByte) return false;
    }
    return true;
  }

 private:
  uint8_t* base_ = nullptr;
  size_t count_ = 0;
};

}  // namespace metrale::test
