// An owning device allocation and a CUDA status check, for the tool's GPU code.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace metrale::cli {

inline void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e));
}

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    cuda_check(cudaMalloc(&ptr_, std::max<size_t>(bytes, 16)), "cudaMalloc");
  }
  template <class T>
  DeviceBuffer(const T* host, size_t count) : DeviceBuffer(count * sizeof(T)) {
    cuda_check(cudaMemcpy(ptr_, host, bytes_, cudaMemcpyHostToDevice), "cudaMemcpy(host to device)");
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }
  // Copies the whole buffer into `host` (which holds bytes() bytes).
  void download(void* host) const {
    cuda_check(cudaMemcpy(host, ptr_, bytes_, cudaMemcpyDeviceToHost), "cudaMemcpy(device to host)");
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

}  // namespace metrale::cli
