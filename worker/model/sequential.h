#ifndef PS_WORKER_MODEL_SEQUENTIAL_H_
#define PS_WORKER_MODEL_SEQUENTIAL_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/device.h"
#include "common/tensor.h"
#include "common/clock.h"
#include "common/timed_event.h"
#include "worker/model/layer.h"
#include "worker/model/parameter_hooks.h"

namespace ps::worker::model {

// Where a sequence reports its children's passes (Sequential::set_events).
struct LayerEvents {
  EventObserver* observer = nullptr;  // null: nothing is reported
  const Clock* clock = nullptr;
  int32_t lane = kTrainerLane;
  int64_t step = -1;
  // Called around each child's passes, with the child's range of the flat
  // parameter buffer, for children that have parameters. Null: nothing.
  ParameterHooks* hooks = nullptr;
};

// Named children applied in order. A child named "conv1" declares its
// tensors as "<prefix>conv1.weight"; a child with an empty name declares its
// own names under the sequence's prefix.
class Sequential final : public Layer {
 public:
  explicit Sequential(Device* device) : Layer(device) {}
  // Returns `layer` for further wiring; ownership passes to the sequence.
  Layer* Add(std::string name, std::unique_ptr<Layer> layer);

  std::string Describe() const override { return "Sequential"; }
  absl::StatusOr<Shape> OutputShape(const Shape& input) const override;
  void Declare(const std::string& prefix, TensorDecls* decls) override;
  absl::StatusOr<Tensor> Forward(const Tensor& x, Mode mode) override;
  absl::StatusOr<Tensor> Backward(const Tensor& dy, bool need_dx) override;

  // Reports each child's Forward and Backward to events->observer, when set,
  // as kForward / kBackward named after the child (its Describe() when
  // unnamed); children that are sequences report nothing of their own.
  // `events` is read at every pass and must outlive the sequence; null (the
  // default): nothing.
  void set_events(const LayerEvents* events) { events_ = events; }

  // Where each child's parameters begin in the flat buffer, for the children
  // that have any, ascending: the layers whose ranges the parameter hooks
  // see. Valid after Declare.
  std::vector<int64_t> ChildParameterBegins() const;

 private:
  // Half-open ranges of the flat parameter buffer per child, as Declare laid
  // them out (absolute offsets: counted from the first declaration of the
  // whole tree, which is what ParameterSet binds to offset 0).
  std::vector<std::pair<int64_t, int64_t>> child_parameters_;
  std::vector<std::pair<std::string, std::unique_ptr<Layer>>> layers_;
  std::vector<std::string> event_names_;  // per child
  const LayerEvents* events_ = nullptr;
};

}  // namespace ps::worker::model

#endif  // PS_WORKER_MODEL_SEQUENTIAL_H_
