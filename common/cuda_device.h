#ifndef PS_COMMON_CUDA_DEVICE_H_
#define PS_COMMON_CUDA_DEVICE_H_

// Include only from code built with PS_WITH_CUDA.

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <memory>

#include "absl/status/statusor.h"
#include "common/cublas_library.h"
#include "common/device.h"

namespace ps {

// One logical CUDA device: a stream and a cuBLAS handle on physical GPU
// `gpu_id` (cuBLAS itself loaded by the first device created, see
// cublas_library.h). Every kernel and copy for this device goes to stream(), so two
// logical devices on one GPU run concurrently and independently, except
// CopyDeviceToHostAsync's copies: they go to a second stream of the device's
// own (the copy stream), which waits for an event recorded on stream() and
// then calls the copy's done with cudaLaunchHostFunc, so kernels issued
// after the copy run while it crosses the link. If the CUDA context fails
// (a sticky error), the runtime calls no host function again: pending
// copies' done are never called (and their closures leak); Synchronize
// reports the error.
class CudaDevice final : public Device {
 public:
  // Creates the stream and cuBLAS handle (kFailedPrecondition when cuBLAS
  // cannot be loaded). `index` is the logical index that names the device
  // ("cuda:<index>").
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Create(int index, int gpu_id);
  ~CudaDevice() override;

  int gpu_id() const { return gpu_id_; }
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return cublas_; }
  // The cuBLAS entry points, for calls on cublas().
  const CublasLibrary& cublas_library() const { return *cublas_library_; }

  // Makes gpu_id() current on the calling thread. Kernel launchers call this
  // first, since replica threads may drive different GPUs.
  absl::Status MakeCurrent() const;

  absl::StatusOr<void*> Allocate(int64_t bytes) override;
  void Deallocate(void* ptr) override;
  absl::StatusOr<void*> AllocateHost(int64_t bytes) override;
  void DeallocateHost(void* ptr) override;
  absl::Status CopyOnDevice(void* dst, const void* src, int64_t bytes) override;
  absl::Status Memzero(void* dst, int64_t bytes) override;
  absl::Status Synchronize() override;
  absl::Status OrderAfterCopiesToHost() override;

 protected:
  absl::Status DoCopyHostToDevice(void* dst, const void* src, int64_t bytes) override;
  absl::Status DoCopyDeviceToHost(void* dst, const void* src, int64_t bytes) override;
  absl::Status DoCopyDeviceToHostAsync(void* dst, const void* src, int64_t bytes,
                                       CopyDone done) override;
  absl::Status DoCopyHostToDeviceAsync(void* dst, const void* src, int64_t bytes) override;

 private:
  CudaDevice(int index, int gpu_id);

  const int gpu_id_;
  cudaStream_t stream_ = nullptr;
  // CopyDeviceToHostAsync's stream, and the events that order it after
  // stream() (compute_issued_) and stream() after it (copies_issued_). One
  // event each serves every copy: a wait takes the event's latest record at
  // the time of the wait. Used from the thread that issues the work.
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t compute_issued_ = nullptr;
  cudaEvent_t copies_issued_ = nullptr;
  const CublasLibrary* cublas_library_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
};

// The CudaDevice behind `device`, which must be a CUDA device.
inline CudaDevice& AsCuda(Device& device) { return static_cast<CudaDevice&>(device); }

}  // namespace ps

#endif  // PS_COMMON_CUDA_DEVICE_H_
