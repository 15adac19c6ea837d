// An owning device allocation for the tests, the benchmarks and the
// `metrale` command: `count` elements of T between two guard regions
// (poisoned bytes on both sides, so a kernel's stray write is caught by
// guards_intact()), the payload itself poisoned with `poison` bytes (0xFF
// makes bf16/f32 a NaN, so an element no kernel wrote shows).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "testing/cuda_check.hpp"

namespace metrale::test {

constexpr size_t kGuardBytes = 4096;  // each side; multiple of 256 keeps the payload aligned
constexpr uint8_t kGuardByte = 0xA5;  // pattern no kernel writes by accident

template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t count, uint8_t poison = 0xFF) : count_(count) {
    METRALE_CUDA_OK(cudaMalloc(&base_, bytes() + 2 * kGuardBytes));
    METRALE_CUDA_OK(cudaMemset(base_, kGuardByte, kGuardBytes));
    METRALE_CUDA_OK(cudaMemset(base_ + kGuardBytes + bytes(), kGuardByte, kGuardBytes));
    fill_bytes(poison);
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host.data(), host.size()); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(base_); }

  T* get() const { return reinterpret_cast<T*>(base_ + kGuardBytes); }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }

  void fill_bytes(uint8_t b) {
    if (bytes()) METRALE_CUDA_OK(cudaMemset(get(), b, bytes()));
  }
  void upload(const T* host, size_t count) {
    if (count != count_) throw std::runtime_error("DeviceBuffer::upload: size mismatch");
    if (bytes()) METRALE_CUDA_OK(cudaMemcpy(get(), host, bytes(), cudaMemcpyHostToDevice));
  }
  void upload(const std::vector<T>& host) { upload(host.data(), host.size()); }
  // Waits for the device, then copies the payload back.
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
