#include "kernels/linear.h"

#include <climits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/dispatch.h"
#include "kernels/gemm.h"
#include "kernels/linear_cpu.h"

#ifdef PS_WITH_CUDA
#include "kernels/linear_cuda.h"
#endif

namespace ps::kernels {
namespace {

// Sizes are non-negative and, since BLAS takes 32-bit sizes, below 2^31.
absl::Status CheckSizes(const char* op, int64_t batch, int64_t in_features, int64_t out_features) {
  const struct {
    const char* name;
    int64_t value;
  } sizes[] = {{"batch", batch}, {"in_features", in_features}, {"out_features", out_features}};
  for (const auto& size : sizes) {
    if (size.value < 0 || size.value > INT_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": ", size.name, " = ", size.value, " is outside [0, ", INT_MAX, "]"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LinearForward(Device& device, int64_t batch, int64_t in_features, int64_t out_features,
                           const float* x, const float* weight, const float* bias, float* y) {
  PS_RETURN_IF_ERROR(CheckSizes("LinearForward", batch, in_features, out_features));
  if (batch * out_features > 0 &&
      (y == nullptr || (in_features > 0 && (x == nullptr || weight == nullptr)))) {
    return absl::InvalidArgumentError("LinearForward: null x, weight or y");
  }
  if (device.is_cpu()) {
    internal::LinearForwardCpu(AsCpu(device), batch, in_features, out_features, x, weight, bias, y);
    return absl::OkStatus();
  }
#ifdef PS_WITH_CUDA
  if (batch == 0 || out_features == 0) return absl::OkStatus();
  if (bias != nullptr) {
    PS_RETURN_IF_ERROR(AsCuda(device).MakeCurrent());
    PS_CUDA_RETURN_IF_ERROR(
        internal::BroadcastRowsCuda(AsCuda(device).stream(), batch, out_features, bias, y));
  }
  return Gemm(device, false, true, batch, out_features, in_features, 1.f, x, weight,
              bias != nullptr ? 1.f : 0.f, y);
#else
  return absl::UnimplementedError("LinearForward: CUDA device in a build without CUDA support");
#endif
}

namespace {

absl::Status CheckRows(const char* op, Device& device, int64_t batch, int64_t in_features,
                       int64_t out_features, int64_t row_begin, int64_t row_end) {
  PS_RETURN_IF_ERROR(CheckSizes(op, batch, in_features, out_features));
  if (row_begin < 0 || row_begin > row_end || row_end > out_features) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": rows [", row_begin, ", ", row_end,
                                                   ") of ", out_features));
  }
  if (!device.is_cpu()) {
    return absl::UnimplementedError(absl::StrCat(op, ": CPU devices only"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LinearForwardRows(Device& device, int64_t batch, int64_t in_features,
                               int64_t out_features, const float* x, const float* weight,
                               int64_t row_begin, int64_t row_end, float* y) {
  PS_RETURN_IF_ERROR(CheckRows("LinearForwardRows", device, batch, in_features, out_features,
                               row_begin, row_end));
  if (batch > 0 && row_end > row_begin &&
      (y == nullptr || (in_features > 0 && (x == nullptr || weight == nullptr)))) {
    return absl::InvalidArgumentError("LinearForwardRows: null x, weight or y");
  }
  internal::LinearForwardRowsCpu(AsCpu(device), batch, in_features, out_features, x, weight,
                                 row_begin, row_end, y);
  return absl::OkStatus();
}

absl::Status LinearAddBias(Device& device, int64_t batch, int64_t out_features, const float* bias,
                           float* y) {
  PS_RETURN_IF_ERROR(CheckRows("LinearAddBias", device, batch, 0, out_features, 0, 0));
  if (batch > 0 && out_features > 0 && (bias == nullptr || y == nullptr)) {
    return absl::InvalidArgumentError("LinearAddBias: null bias or y");
  }
  internal::LinearAddBiasCpu(AsCpu(device), batch, out_features, bias, y);
  return absl::OkStatus();
}

absl::Status LinearWeightGradientRows(Device& device, int64_t batch, int64_t in_features,
                                      int64_t out_features, const float* x, const float* dy,
                                      int64_t row_begin, int64_t row_end, float* dweight) {
  PS_RETURN_IF_ERROR(CheckRows("LinearWeightGradientRows", device, batch, in_features,
                               out_features, row_begin, row_end));
  if (row_end > row_begin && in_features > 0 &&
      (dweight == nullptr || (batch > 0 && (x == nullptr || dy == nullptr)))) {
    return absl::InvalidArgumentError("LinearWeightGradientRows: null x, dy or dweight");
  }
  internal::LinearWeightGradientRowsCpu(AsCpu(device), batch, in_features, out_features, x, dy,
                                        row_begin, row_end, dweight);
  return absl::OkStatus();
}

absl::Status LinearBackward(Device& device, int64_t batch, int64_t in_features,
                            int64_t out_features, const float* x, const float* weight,
                            const float* dy, float* dx, float* dweight, float* dbias) {
  PS_RETURN_IF_ERROR(CheckSizes("LinearBackward", batch, in_features, out_features));
  if (batch > 0 && ((out_features > 0 && dy == nullptr) ||
                    (dweight != nullptr && in_features > 0 && x == nullptr) ||
                    (dx != nullptr && in_features > 0 && out_features > 0 && weight == nullptr))) {
    return absl::InvalidArgumentError("LinearBackward: null x, weight or dy");
  }
  if (device.is_cpu()) {
    internal::LinearBackwardCpu(AsCpu(device), batch, in_features, out_features, x, weight, dy, dx,
                                dweight, dbias);
    return absl::OkStatus();
  }
#ifdef PS_WITH_CUDA
  if (dx != nullptr) {
    PS_RETURN_IF_ERROR(
        Gemm(device, false, false, batch, in_features, out_features, 1.f, dy, weight, 0.f, dx));
  }
  if (dweight != nullptr) {
    PS_RETURN_IF_ERROR(
        Gemm(device, true, false, out_features, in_features, batch, 1.f, dy, x, 0.f, dweight));
  }
  if (dbias != nullptr) {
    PS_RETURN_IF_ERROR(AsCuda(device).MakeCurrent());
    PS_CUDA_RETURN_IF_ERROR(
        internal::ColumnSumsCuda(AsCuda(device).stream(), batch, out_features, dy, dbias));
  }
  return absl::OkStatus();
#else
  return absl::UnimplementedError("LinearBackward: CUDA device in a build without CUDA support");
#endif
}

}  // namespace ps::kernels
