// "none": the sum-only server's optimizer. It applies no update: it writes
// the mean gradient of the iteration's global batch,
//
//   out[j] = s * g[j],   s = 1.f / float(num_samples) / loss_scale
//
// with s rounded to float once, the very factor SGD multiplies the summed
// gradient by (so the mean is the sum times the float nearest
// 1 / num_samples, not the sum divided by num_samples), and g[j] the summed
// gradient: grad_sum[j], or grad_sum[j] + last[j] in float for the
// last-term variant (0 + last[j] for a sum not started, -0 becoming +0 as
// the sum's own first term does). It never reads params_in, keeps no state
// (no momentum, so checkpoints hold none) and ignores `step`. Workers that
// read these versions apply an optimizer of their own (ps.torch's
// DistributedOptimizer with any torch.optim optimizer, as BytePS does);
// version 0 stays the initial parameters, which no update writes.

#include <cstdint>
#include <memory>

#include "common/optimizer/optimizer.h"

namespace ps {
namespace {

// Below this many elements a loop stays on one thread, as SGD's kernel.
constexpr int64_t kMinChunk = 1 << 15;

class MeanGradient final : public Optimizer {
 public:
  MeanGradient(const OptimizerOptions& options, int64_t num_parameters, CpuDevice* device)
      : Optimizer(options, num_parameters, device) {}

  Output output() const override { return Output::kMeanGradient; }

 private:
  absl::Status Update(int64_t /*step*/, float grad_scale, int64_t /*offset*/,
                      absl::Span<const float> grad_sum, absl::Span<const float> /*params_in*/,
                      absl::Span<float> params_out) override {
    const float* const grad = grad_sum.data();
    float* const out = params_out.data();
    device().ParallelFor(static_cast<int64_t>(params_out.size()), kMinChunk,
                         [=](int64_t b, int64_t e) {
                           for (int64_t j = b; j < e; ++j) out[j] = grad_scale * grad[j];
                         });
    return absl::OkStatus();
  }

  absl::Status UpdateAdding(int64_t /*step*/, float grad_scale, int64_t /*offset*/,
                            absl::Span<const float> grad_sum, F32Pieces last_part,
                            absl::Span<const float> /*params_in*/,
                            absl::Span<float> params_out) override {
    const float* const sum = grad_sum.empty() ? nullptr : grad_sum.data();
    float* const out = params_out.data();
    return ForEachRunInParallel(last_part, [=](const F32Run& run) {
      const char* const bytes = static_cast<const char*>(run.data());
      for (int64_t i = 0; i < run.count; ++i) {
        const float last = internal::LoadF32(bytes + 4 * i);
        const int64_t j = run.first + i;
        out[j] = grad_scale * (sum != nullptr ? sum[j] + last : last + 0.f);
      }
      return absl::OkStatus();
    });
  }
};

}  // namespace

namespace internal {

std::unique_ptr<Optimizer> NewMeanGradient(const OptimizerOptions& options,
                                           int64_t num_parameters, CpuDevice* device) {
  return std::make_unique<MeanGradient>(options, num_parameters, device);
}

}  // namespace internal
}  // namespace ps
