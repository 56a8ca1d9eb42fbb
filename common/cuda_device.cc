#include "common/cuda_device.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cuda_check.h"
#include "common/status_macros.h"

namespace ps {

CudaDevice::CudaDevice(int index, int gpu_id)
    : Device(DeviceType::kCuda, absl::StrCat("cuda:", index)), gpu_id_(gpu_id) {}

absl::StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Create(int index, int gpu_id) {
  std::unique_ptr<CudaDevice> device(new CudaDevice(index, gpu_id));
  PS_RETURN_IF_ERROR(device->MakeCurrent());
  PS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&device->stream_, cudaStreamNonBlocking));
  PS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&device->copy_stream_, cudaStreamNonBlocking));
  PS_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&device->compute_issued_, cudaEventDisableTiming));
  PS_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&device->copies_issued_, cudaEventDisableTiming));
  PS_ASSIGN_OR_RETURN(device->cublas_library_, Cublas());
  PS_CUBLAS_RETURN_IF_ERROR(device->cublas_library_->create(&device->cublas_));
  PS_CUBLAS_RETURN_IF_ERROR(device->cublas_library_->set_stream(device->cublas_, device->stream_));
  return device;
}

CudaDevice::~CudaDevice() {
  ReleaseScratch();
  cudaSetDevice(gpu_id_);
  if (cublas_ != nullptr) cublas_library_->destroy(cublas_);
  if (copy_stream_ != nullptr) {
    cudaStreamSynchronize(copy_stream_);
    cudaStreamDestroy(copy_stream_);
  }
  if (stream_ != nullptr) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  if (compute_issued_ != nullptr) cudaEventDestroy(compute_issued_);
  if (copies_issued_ != nullptr) cudaEventDestroy(copies_issued_);
}

absl::Status CudaDevice::MakeCurrent() const {
  PS_CUDA_RETURN_IF_ERROR(cudaSetDevice(gpu_id_));
  return absl::OkStatus();
}

absl::StatusOr<void*> CudaDevice::Allocate(int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("negative allocation ", bytes));
  if (bytes == 0) return nullptr;
  PS_RETURN_IF_ERROR(MakeCurrent());
  void* ptr = nullptr;
  PS_CUDA_RETURN_IF_ERROR(cudaMalloc(&ptr, bytes));
  return ptr;
}

void CudaDevice::Deallocate(void* ptr) {
  if (ptr == nullptr) return;
  cudaSetDevice(gpu_id_);
  // Memory may still be in use by queued work on this stream.
  cudaStreamSynchronize(stream_);
  cudaFree(ptr);
}

absl::StatusOr<void*> CudaDevice::AllocateHost(int64_t bytes) {
  if (bytes == 0) return nullptr;
  void* ptr = nullptr;
  PS_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable));
  return ptr;
}

void CudaDevice::DeallocateHost(void* ptr) {
  if (ptr != nullptr) cudaFreeHost(ptr);
}

absl::Status CudaDevice::CopyOnDevice(void* dst, const void* src, int64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  PS_RETURN_IF_ERROR(MakeCurrent());
  PS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  return absl::OkStatus();
}

absl::Status CudaDevice::Memzero(void* dst, int64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  PS_RETURN_IF_ERROR(MakeCurrent());
  PS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dst, 0, bytes, stream_));
  return absl::OkStatus();
}

absl::Status CudaDevice::Synchronize() {
  PS_RETURN_IF_ERROR(MakeCurrent());
  PS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaDevice::DoCopyHostToDevice(void* dst, const void* src, int64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  PS_RETURN_IF_ERROR(MakeCurrent());
  PS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
  PS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaDevice::DoCopyDeviceToHost(void* dst, const void* src, int64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  PS_RETURN_IF_ERROR(MakeCurrent());
  PS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  PS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

namespace {

// cudaLaunchHostFunc's function: runs a copy's done (a CopyDone the host
// function owns) once the copy has landed.
void RunCopyDone(void* user_data) {
  std::unique_ptr<Device::CopyDone> done(static_cast<Device::CopyDone*>(user_data));
  (*done)(absl::OkStatus());
}

}  // namespace

absl::Status CudaDevice::DoCopyDeviceToHostAsync(void* dst, const void* src, int64_t bytes,
                                                 CopyDone done) {
  PS_RETURN_IF_ERROR(MakeCurrent());
  // 1. The copy stream waits for everything issued to stream() so far.
  PS_CUDA_RETURN_IF_ERROR(cudaEventRecord(compute_issued_, stream_));
  PS_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_stream_, compute_issued_, 0));
  // 2. The copy, on the copy stream: stream() runs on meanwhile.
  if (bytes > 0) {
    PS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, copy_stream_));
  }
  // 3. Once it has landed, done, on a runtime thread.
  auto owned = std::make_unique<CopyDone>(std::move(done));
  PS_CUDA_RETURN_IF_ERROR(cudaLaunchHostFunc(copy_stream_, RunCopyDone, owned.get()));
  owned.release();  // RunCopyDone's now
  return absl::OkStatus();
}

absl::Status CudaDevice::OrderAfterCopiesToHost() {
  PS_RETURN_IF_ERROR(MakeCurrent());
  PS_CUDA_RETURN_IF_ERROR(cudaEventRecord(copies_issued_, copy_stream_));
  PS_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, copies_issued_, 0));
  return absl::OkStatus();
}

absl::Status CudaDevice::DoCopyHostToDeviceAsync(void* dst, const void* src, int64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  PS_RETURN_IF_ERROR(MakeCurrent());
  // On stream(): ordered before the kernels issued after it. From pinned
  // memory the call returns without waiting for the copy.
  PS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
  return absl::OkStatus();
}

}  // namespace ps
