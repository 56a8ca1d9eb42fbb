#include "worker/model/sequential.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ps::worker::model {

Layer* Sequential::Add(std::string name, std::unique_ptr<Layer> layer) {
  Layer* raw = layer.get();
  event_names_.push_back(name.empty() ? layer->Describe() : name);
  layers_.emplace_back(std::move(name), std::move(layer));
  return raw;
}

absl::StatusOr<Shape> Sequential::OutputShape(const Shape& input) const {
  Shape shape = input;
  for (const auto& [name, layer] : layers_) {
    PS_ASSIGN_OR_RETURN(shape, layer->OutputShape(shape));
  }
  return shape;
}

namespace {
int64_t DeclaredElements(const TensorDecls& decls) {
  int64_t n = 0;
  for (const TensorSlot& slot : decls.parameters) n += NumElements(slot.spec.shape);
  return n;
}
}  // namespace

void Sequential::Declare(const std::string& prefix, TensorDecls* decls) {
  child_parameters_.clear();
  for (const auto& [name, layer] : layers_) {
    const int64_t begin = DeclaredElements(*decls);
    layer->Declare(name.empty() ? prefix : absl::StrCat(prefix, name, "."), decls);
    child_parameters_.emplace_back(begin, DeclaredElements(*decls));
  }
}

std::vector<int64_t> Sequential::ChildParameterBegins() const {
  std::vector<int64_t> begins;
  for (const auto& [begin, end] : child_parameters_) {
    if (begin < end) begins.push_back(begin);
  }
  return begins;
}

absl::StatusOr<Tensor> Sequential::Forward(const Tensor& x, Mode mode) {
  const LayerEvents events = events_ != nullptr ? *events_ : LayerEvents();
  Tensor h = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    Layer& layer = *layers_[i].second;
    const bool hooked = events.hooks != nullptr && i < child_parameters_.size() &&
                        child_parameters_[i].first < child_parameters_[i].second;
    const bool in_parts = hooked && layer.AwaitsParametersInParts();
    if (hooked && !in_parts) {
      // Before the event: waiting for the parameters is not the layer's work.
      PS_RETURN_IF_ERROR(
          events.hooks->BeforeForward(child_parameters_[i].first, child_parameters_[i].second));
    }
    const int64_t begin = hooked ? child_parameters_[i].first : 0;
    const std::function<absl::Status(int64_t, int64_t)> needed = [&](int64_t from, int64_t to) {
      return events.hooks->BeforeForward(begin + from, begin + to);
    };
    if (in_parts) layer.set_parameters_needed(&needed);
    absl::StatusOr<Tensor> out;
    {
      ScopedEvent event(events.observer, events.clock, EventKind::kForward, events.lane,
                        events.step, event_names_[i]);
      out = layer.Forward(h, mode);
    }
    if (in_parts) layer.set_parameters_needed(nullptr);
    PS_ASSIGN_OR_RETURN(h, std::move(out));
  }
  return h;
}

absl::StatusOr<Tensor> Sequential::Backward(const Tensor& dy, bool need_dx) {
  const LayerEvents events = events_ != nullptr ? *events_ : LayerEvents();
  Tensor g = dy;
  for (size_t i = layers_.size(); i-- > 0;) {
    Layer& layer = *layers_[i].second;
    const bool hooked = events.hooks != nullptr && i < child_parameters_.size() &&
                        child_parameters_[i].first < child_parameters_[i].second;
    // A layer that has its gradients before it is done (Linear, before dx)
    // says so, and the hooks hear it at once.
    const std::function<void(int64_t)> ready = [&](int64_t from) {
      events.hooks->GradientsReady(child_parameters_[i].first + from,
                                   child_parameters_[i].second);
    };
    if (hooked) layer.set_gradients_ready(&ready);
    absl::StatusOr<Tensor> next;
    {
      ScopedEvent event(events.observer, events.clock, EventKind::kBackward, events.lane,
                        events.step, event_names_[i]);
      // Every layer but the first needs its input gradient for the one below.
      next = layer.Backward(g, i > 0 || need_dx);
    }
    layer.set_gradients_ready(nullptr);
    PS_RETURN_IF_ERROR(next.status());
    g = *std::move(next);
    if (hooked) {
      events.hooks->AfterBackward(child_parameters_[i].first, child_parameters_[i].second);
    }
  }
  return g;
}

}  // namespace ps::worker::model
