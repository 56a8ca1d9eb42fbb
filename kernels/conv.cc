#include "kernels/conv.h"

#include <algorithm>
#include <climits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/conv_cpu.h"
#include "kernels/conv_dnnl.h"
#include "kernels/dispatch.h"
#include "kernels/gemm.h"

#ifdef PS_WITH_CUDA
#include "kernels/conv_cuda.h"
#endif

namespace ps::kernels {
namespace {

absl::Status CheckPointers(const float* x, const float* weight, const void* out) {
  if (x == nullptr || weight == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("Conv2d: null input, weight or output pointer");
  }
  return absl::OkStatus();
}

#ifdef PS_WITH_CUDA
// The columns of one block of samples may take this much GPU memory; the
// batch runs in blocks of at most this size (LeNet's whole batch fits).
constexpr int64_t kGpuBlockColumnBytes = int64_t{256} << 20;

internal::ConvGeometry ToGeometry(const Conv2dShape& s) {
  return {s.in_channels, s.height,   s.width, s.out_channels, s.kernel_h,     s.kernel_w,
          s.stride_h,    s.stride_w, s.pad_h, s.pad_w,        s.out_height(), s.out_width()};
}

struct GpuPlan {
  int64_t block;    // samples per block
  int64_t k;        // C * KH * KW
  int64_t pixels;   // OH * OW
  int64_t in_size;  // per sample
  int64_t out_size;
};

GpuPlan MakeGpuPlan(const Conv2dShape& s) {
  GpuPlan plan;
  plan.k = s.in_channels * s.kernel_h * s.kernel_w;
  plan.pixels = s.out_height() * s.out_width();
  plan.in_size = s.in_channels * s.height * s.width;
  plan.out_size = s.out_channels * plan.pixels;
  const int64_t sample_bytes = plan.k * plan.pixels * static_cast<int64_t>(sizeof(float));
  // Also keep count * pixels, cuBLAS's n, below 2^31.
  plan.block = std::clamp<int64_t>(
      std::min(kGpuBlockColumnBytes / sample_bytes, int64_t{INT_MAX} / plan.pixels), 1, s.batch);
  return plan;
}

absl::StatusOr<float*> GpuScratch(Device& device, int slot, int64_t floats) {
  PS_ASSIGN_OR_RETURN(void* ptr,
                      device.Scratch(slot, floats * static_cast<int64_t>(sizeof(float))));
  return static_cast<float*>(ptr);
}

// im2col on the GPU, one cuBLAS GEMM per block of samples, then the result
// to NCHW with the bias.
absl::Status Conv2dForwardCuda(Device& device, const Conv2dShape& shape, const float* x,
                               const float* weight, const float* bias, float* y) {
  CudaDevice& cuda = AsCuda(device);
  PS_RETURN_IF_ERROR(cuda.MakeCurrent());
  const cudaStream_t stream = cuda.stream();
  const internal::ConvGeometry g = ToGeometry(shape);
  const GpuPlan plan = MakeGpuPlan(shape);
  const int64_t o = shape.out_channels;
  PS_ASSIGN_OR_RETURN(float* cols, GpuScratch(device, 0, plan.k * plan.block * plan.pixels));
  PS_ASSIGN_OR_RETURN(float* out, GpuScratch(device, 1, o * plan.block * plan.pixels));
  for (int64_t n0 = 0; n0 < shape.batch; n0 += plan.block) {
    const int64_t count = std::min(plan.block, shape.batch - n0);
    const int64_t ld = count * plan.pixels;
    float* y0 = y + n0 * plan.out_size;
    PS_CUDA_RETURN_IF_ERROR(internal::Im2ColCuda(stream, g, count, x + n0 * plan.in_size, cols));
    // With one sample the [O x P] product is already NCHW.
    float* product = count == 1 ? y0 : out;
    PS_RETURN_IF_ERROR(Gemm(device, false, false, o, ld, plan.k, 1.f, weight, cols, 0.f, product));
    if (count > 1 || bias != nullptr) {
      PS_CUDA_RETURN_IF_ERROR(
          internal::BlockToNchwCuda(stream, count, o, plan.pixels, product, bias, y0));
    }
  }
  return absl::OkStatus();
}

absl::Status Conv2dBackwardCuda(Device& device, const Conv2dShape& shape, const float* x,
                                const float* weight, const float* dy, float* dx, float* dweight,
                                float* dbias) {
  CudaDevice& cuda = AsCuda(device);
  PS_RETURN_IF_ERROR(cuda.MakeCurrent());
  const cudaStream_t stream = cuda.stream();
  const internal::ConvGeometry g = ToGeometry(shape);
  const GpuPlan plan = MakeGpuPlan(shape);
  const int64_t o = shape.out_channels;
  PS_ASSIGN_OR_RETURN(float* cols, GpuScratch(device, 0, plan.k * plan.block * plan.pixels));
  PS_ASSIGN_OR_RETURN(float* dy_block, GpuScratch(device, 1, o * plan.block * plan.pixels));
  for (int64_t n0 = 0; n0 < shape.batch; n0 += plan.block) {
    const int64_t count = std::min(plan.block, shape.batch - n0);
    const int64_t ld = count * plan.pixels;
    const bool accumulate = n0 > 0;
    // 1. dy as an [O x count*P] matrix (with one sample it already is).
    const float* dyb = dy + n0 * plan.out_size;
    if (count > 1) {
      PS_CUDA_RETURN_IF_ERROR(internal::NchwToBlockCuda(stream, count, o, plan.pixels,
                                                        dy + n0 * plan.out_size, dy_block));
      dyb = dy_block;
    }
    if (dbias != nullptr) {
      PS_CUDA_RETURN_IF_ERROR(internal::RowSumsCuda(stream, o, ld, dyb, accumulate, dbias));
    }
    // 2. dweight [O x K] (+)= dy block * columns^T.
    PS_CUDA_RETURN_IF_ERROR(internal::Im2ColCuda(stream, g, count, x + n0 * plan.in_size, cols));
    PS_RETURN_IF_ERROR(
        Gemm(device, false, true, o, plan.k, ld, 1.f, dyb, cols, accumulate ? 1.f : 0.f, dweight));
    // 3. dx: weight^T * dy block into the columns' buffer, folded onto the image.
    if (dx != nullptr) {
      PS_RETURN_IF_ERROR(Gemm(device, true, false, plan.k, ld, o, 1.f, weight, dyb, 0.f, cols));
      PS_CUDA_RETURN_IF_ERROR(internal::Col2ImCuda(stream, g, count, cols, dx + n0 * plan.in_size));
    }
  }
  return absl::OkStatus();
}
#endif  // PS_WITH_CUDA

}  // namespace

absl::Status ValidateConv2dShape(const Conv2dShape& s) {
  const struct {
    const char* name;
    int64_t value;
  } positive[] = {
      {"batch", s.batch},       {"in_channels", s.in_channels},   {"height", s.height},
      {"width", s.width},       {"out_channels", s.out_channels}, {"kernel_h", s.kernel_h},
      {"kernel_w", s.kernel_w}, {"stride_h", s.stride_h},         {"stride_w", s.stride_w}};
  for (const auto& field : positive) {
    if (field.value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("Conv2d: ", field.name, " = ", field.value, " must be positive"));
    }
    // Keeps every product below (sizes, GEMM dimensions) far from overflow.
    if (field.value > INT_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat("Conv2d: ", field.name, " = ", field.value, " exceeds ", INT_MAX));
    }
  }
  if (s.pad_h < 0 || s.pad_h > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("Conv2d: pad_h = ", s.pad_h, " is out of range"));
  }
  if (s.pad_w < 0 || s.pad_w > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("Conv2d: pad_w = ", s.pad_w, " is out of range"));
  }
  if (s.kernel_h > s.height + 2 * s.pad_h) {
    return absl::InvalidArgumentError(
        absl::StrCat("Conv2d: kernel_h = ", s.kernel_h,
                     " exceeds height + 2 * pad_h = ", s.height + 2 * s.pad_h, ": empty output"));
  }
  if (s.kernel_w > s.width + 2 * s.pad_w) {
    return absl::InvalidArgumentError(
        absl::StrCat("Conv2d: kernel_w = ", s.kernel_w,
                     " exceeds width + 2 * pad_w = ", s.width + 2 * s.pad_w, ": empty output"));
  }
  // BLAS takes 32-bit sizes: a GEMM's depth (C*KH*KW) and one sample's
  // output pixels must fit. Each factor is below 2^32 here, so the checks
  // divide rather than multiply to stay clear of overflow.
  const int64_t taps = s.kernel_h * s.kernel_w;
  if (s.in_channels > INT_MAX / taps) {
    return absl::InvalidArgumentError(
        absl::StrCat("Conv2d: in_channels * kernel_h * kernel_w = ", s.in_channels, " * ", taps,
                     " exceeds ", INT_MAX));
  }
  if (s.out_height() > INT_MAX / s.out_width()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Conv2d: out_height * out_width = ", s.out_height(), " * ", s.out_width(),
                     " exceeds ", INT_MAX));
  }
  return absl::OkStatus();
}

absl::Status Conv2dForward(Device& device, const Conv2dShape& shape, const float* x,
                           const float* weight, const float* bias, float* y) {
  PS_RETURN_IF_ERROR(ValidateConv2dShape(shape));
  PS_RETURN_IF_ERROR(CheckPointers(x, weight, y));
  if (device.is_cpu()) {
    // oneDNN's convolution primitive computes in fp32: a device in half
    // precision runs every convolution on its GEMMs instead.
    internal::DnnlMethod method;
    if (device.gemm_precision() == Precision::kFp32 &&
        internal::PreferDnnlConvForward(shape, &method)) {
      return internal::Conv2dForwardDnnl(AsCpu(device), shape, method, x, weight, bias, y);
    }
    return internal::Conv2dForwardCpu(AsCpu(device), shape, x, weight, bias, y);
  }
#ifdef PS_WITH_CUDA
  return Conv2dForwardCuda(device, shape, x, weight, bias, y);
#else
  return absl::UnimplementedError("Conv2dForward: CUDA device in a build without CUDA support");
#endif
}

absl::Status Conv2dBackward(Device& device, const Conv2dShape& shape, const float* x,
                            const float* weight, const float* dy, float* dx, float* dweight,
                            float* dbias) {
  PS_RETURN_IF_ERROR(ValidateConv2dShape(shape));
  PS_RETURN_IF_ERROR(CheckPointers(x, weight, dweight));
  if (dy == nullptr) return absl::InvalidArgumentError("Conv2dBackward: dy is null");
  if (device.is_cpu()) {
    internal::DnnlMethod method;
    if (device.gemm_precision() == Precision::kFp32 &&
        internal::PreferDnnlConvBackward(shape, dx != nullptr, &method)) {
      return internal::Conv2dBackwardDnnl(AsCpu(device), shape, method, x, weight, dy, dx,
                                          dweight, dbias);
    }
    return internal::Conv2dBackwardCpu(AsCpu(device), shape, x, weight, dy, dx, dweight, dbias);
  }
#ifdef PS_WITH_CUDA
  return Conv2dBackwardCuda(device, shape, x, weight, dy, dx, dweight, dbias);
#else
  return absl::UnimplementedError("Conv2dBackward: CUDA device in a build without CUDA support");
#endif
}

namespace {

absl::Status ValidateEpilogue(const Conv2dShape& shape, const ConvActivationPool& e) {
  PS_RETURN_IF_ERROR(ValidatePool2dShape(e.pool));
  if (e.pool.batch != shape.batch || e.pool.channels != shape.out_channels ||
      e.pool.height != shape.out_height() || e.pool.width != shape.out_width()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Conv2dActivationPool: pooling over [", e.pool.batch, ", ", e.pool.channels, ", ",
        e.pool.height, ", ", e.pool.width, "] but the convolution's output is [", shape.batch,
        ", ", shape.out_channels, ", ", shape.out_height(), ", ", shape.out_width(), "]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Conv2dActivationPoolForward(Device& device, const Conv2dShape& shape,
                                         const ConvActivationPool& epilogue, const float* x,
                                         const float* weight, const float* bias, float* a,
                                         float* y, int32_t* argmax) {
  PS_RETURN_IF_ERROR(ValidateConv2dShape(shape));
  PS_RETURN_IF_ERROR(ValidateEpilogue(shape, epilogue));
  PS_RETURN_IF_ERROR(CheckPointers(x, weight, a));
  if (y == nullptr || (epilogue.max && argmax == nullptr)) {
    return absl::InvalidArgumentError("Conv2dActivationPoolForward: null y or argmax");
  }
  if (device.is_cpu()) {
    internal::ActivationPoolEpilogue e;
    e.activation = epilogue.activation;
    e.max = epilogue.max;
    e.pool = epilogue.pool;
    e.a = a;
    e.y = y;
    e.argmax = argmax;
    return internal::Conv2dForwardCpu(AsCpu(device), shape, x, weight, bias, nullptr, &e);
  }
  // On a GPU the passes run one after another: the convolution into a, then
  // the activation in place and the pooling.
  PS_RETURN_IF_ERROR(Conv2dForward(device, shape, x, weight, bias, a));
  if (epilogue.max) {
    return ActivationMaxPool2dForward(device, epilogue.activation, epilogue.pool, a, a, y, argmax);
  }
  return ActivationAvgPool2dForward(device, epilogue.activation, epilogue.pool, a, a, y);
}

absl::Status Conv2dActivationPoolBackward(Device& device, const Conv2dShape& shape,
                                          const ConvActivationPool& epilogue, const float* x,
                                          const float* weight, const float* a, const float* dy,
                                          const int32_t* argmax, float* dx, float* dweight,
                                          float* dbias) {
  PS_RETURN_IF_ERROR(ValidateConv2dShape(shape));
  PS_RETURN_IF_ERROR(ValidateEpilogue(shape, epilogue));
  PS_RETURN_IF_ERROR(CheckPointers(x, weight, dweight));
  if (a == nullptr || dy == nullptr || (epilogue.max && argmax == nullptr)) {
    return absl::InvalidArgumentError("Conv2dActivationPoolBackward: null a, dy or argmax");
  }
  if (device.is_cpu()) {
    internal::ActivationPoolEpilogue e;
    e.activation = epilogue.activation;
    e.max = epilogue.max;
    e.pool = epilogue.pool;
    e.a_in = a;
    e.pooled_dy = dy;
    e.argmax_in = argmax;
    return internal::Conv2dBackwardCpu(AsCpu(device), shape, x, weight, nullptr, dx, dweight,
                                       dbias, &e);
  }
  const int64_t n = shape.batch * shape.out_channels * shape.out_height() * shape.out_width();
  PS_ASSIGN_OR_RETURN(void* scratch, device.Scratch(2, n * static_cast<int64_t>(sizeof(float))));
  float* dconv = static_cast<float*>(scratch);
  if (epilogue.max) {
    PS_RETURN_IF_ERROR(ActivationMaxPool2dBackward(device, epilogue.activation, epilogue.pool, a,
                                                   dy, argmax, dconv));
  } else {
    PS_RETURN_IF_ERROR(
        ActivationAvgPool2dBackward(device, epilogue.activation, epilogue.pool, a, dy, dconv));
  }
  return Conv2dBackward(device, shape, x, weight, dconv, dx, dweight, dbias);
}

}  // namespace ps::kernels
