#ifndef PS_COMMON_TENSOR_H_
#define PS_COMMON_TENSOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/device.h"
#include "common/dtype.h"

namespace ps {

// Dimensions, outermost first (row-major). Sizes are 64-bit throughout.
using Shape = std::vector<int64_t>;

int64_t NumElements(const Shape& shape);
// prod(shape) into *out, for shapes from outside (files, the wire); false,
// *out untouched, when a dimension is negative or the product overflows.
bool CheckedNumElements(const Shape& shape, int64_t* out);
std::string ShapeToString(const Shape& shape);  // "[256, 1, 28, 28]"

// A dense, row-major array on one device. A Tensor is a cheap handle: copies
// share the storage (like a shared_ptr), so writes through one are seen by
// all. View() makes a handle on part of the storage; a model's parameters are
// views into one flat buffer so that a whole model moves in one copy.
//
// The storage is released when the last handle goes; the Device must outlive
// every Tensor on it. Not thread-safe for concurrent writes to the same data.
class Tensor {
 public:
  Tensor() = default;  // empty: no device, no storage, shape [].

  // Uninitialised storage for `shape` on `device`.
  static absl::StatusOr<Tensor> Empty(Device* device, Shape shape, DType dtype = DType::kF32);
  // Zero-filled (asynchronously on CUDA, ordered before later work).
  static absl::StatusOr<Tensor> Zeros(Device* device, Shape shape, DType dtype = DType::kF32);
  // An fp32 tensor on `device` holding `values` (copied from host memory).
  static absl::StatusOr<Tensor> FromHost(Device* device, Shape shape,
                                         absl::Span<const float> values);

  bool empty() const { return storage_ == nullptr; }
  Device* device() const { return device_; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  // dim(-1) is the last dimension.
  int64_t dim(int i) const { return shape_[i < 0 ? i + rank() : i]; }
  int64_t num_elements() const { return num_elements_; }
  int64_t num_bytes() const { return num_elements_ * DTypeSize(dtype_); }

  // Element pointers in the device's memory (host memory for CPU devices).
  template <typename T>
  const T* data() const {
    return reinterpret_cast<const T*>(raw_data());
  }
  template <typename T>
  T* mutable_data() {
    return reinterpret_cast<T*>(mutable_raw_data());
  }
  const void* raw_data() const;
  void* mutable_raw_data() { return const_cast<void*>(raw_data()); }

  // A handle on `shape`'s worth of elements starting `element_offset` elements
  // into this tensor's storage. kOutOfRange if it does not fit.
  absl::StatusOr<Tensor> View(int64_t element_offset, Shape shape) const;
  // The same elements with another shape of equal size.
  absl::StatusOr<Tensor> Reshape(Shape shape) const;

  // Copies all elements to/from host memory; sizes must match exactly.
  absl::Status CopyToHost(absl::Span<float> out) const;
  absl::Status CopyFromHost(absl::Span<const float> values);
  // Convenience for tests and tools: the elements as a host vector (fp32).
  absl::StatusOr<std::vector<float>> ToVector() const;
  // Copies `other`'s elements into this tensor (same device, same size).
  absl::Status CopyFrom(const Tensor& other);
  absl::Status SetZero();

 private:
  struct Storage;

  Device* device_ = nullptr;
  std::shared_ptr<Storage> storage_;
  int64_t byte_offset_ = 0;
  Shape shape_;
  int64_t num_elements_ = 0;
  DType dtype_ = DType::kF32;
};

}  // namespace ps

#endif  // PS_COMMON_TENSOR_H_
