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

void Sequential::Declare(const std::string& prefix, TensorDecls* decls) {
  for (const auto& [name, layer] : layers_) {
    layer->Declare(name.empty() ? prefix : absl::StrCat(prefix, name, "."), decls);
  }
}

absl::StatusOr<Tensor> Sequential::Forward(const Tensor& x, Mode mode) {
  const LayerEvents events = events_ != nullptr ? *events_ : LayerEvents();
  Tensor h = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    ScopedEvent event(events.observer, events.clock, EventKind::kForward, events.lane, events.step,
                      event_names_[i]);
    PS_ASSIGN_OR_RETURN(h, layers_[i].second->Forward(h, mode));
  }
  return h;
}

absl::StatusOr<Tensor> Sequential::Backward(const Tensor& dy, bool need_dx) {
  const LayerEvents events = events_ != nullptr ? *events_ : LayerEvents();
  Tensor g = dy;
  for (size_t i = layers_.size(); i-- > 0;) {
    ScopedEvent event(events.observer, events.clock, EventKind::kBackward, events.lane,
                      events.step, event_names_[i]);
    // Every layer but the first needs its input gradient for the one below.
    PS_ASSIGN_OR_RETURN(g, layers_[i].second->Backward(g, i > 0 || need_dx));
  }
  return g;
}

}  // namespace ps::worker::model
