// Device discovery for the CUDA backend.
#include <cuda_runtime.h>

#include "metrale/cuda.hpp"
#include "metrale/error.hpp"

namespace metrale::cuda {

bool available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
  return major == 9;  // the kernels are built for sm_90a only
}

DeviceInfo device_info() {
  DeviceInfo info;
  cudaDeviceProp prop{};
  cudaError_t e = cudaGetDevice(&info.device);
  if (e == cudaSuccess) e = cudaGetDeviceProperties(&prop, info.device);
  if (e != cudaSuccess) throw CudaError(std::string("metrale: no usable CUDA device: ") + cudaGetErrorString(e));
  info.num_sms = prop.multiProcessorCount;
  info.major = prop.major;
  info.minor = prop.minor;
  info.l2_bytes = prop.l2CacheSize;
  info.name = prop.name;
  return info;
}

}  // namespace metrale::cuda
