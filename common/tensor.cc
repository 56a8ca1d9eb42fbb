#include "common/tensor.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace ps {

struct Tensor::Storage {
  Storage(Device* d, void* p) : device(d), ptr(p) {}
  ~Storage() { device->Deallocate(ptr); }
  Device* device;
  void* ptr;
};

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool CheckedNumElements(const Shape& shape, int64_t* out) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return false;
  }
  *out = n;
  return true;
}

std::string ShapeToString(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<Tensor> Tensor::Empty(Device* device, Shape shape, DType dtype) {
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("negative dimension in shape ", ShapeToString(shape)));
    }
  }
  Tensor t;
  t.device_ = device;
  t.dtype_ = dtype;
  t.num_elements_ = NumElements(shape);
  t.shape_ = std::move(shape);
  PS_ASSIGN_OR_RETURN(void* ptr, device->Allocate(t.num_bytes()));
  t.storage_ = std::make_shared<Storage>(device, ptr);
  return t;
}

absl::StatusOr<Tensor> Tensor::Zeros(Device* device, Shape shape, DType dtype) {
  PS_ASSIGN_OR_RETURN(Tensor t, Empty(device, std::move(shape), dtype));
  PS_RETURN_IF_ERROR(t.SetZero());
  return t;
}

absl::StatusOr<Tensor> Tensor::FromHost(Device* device, Shape shape,
                                        absl::Span<const float> values) {
  PS_ASSIGN_OR_RETURN(Tensor t, Empty(device, std::move(shape), DType::kF32));
  PS_RETURN_IF_ERROR(t.CopyFromHost(values));
  return t;
}

const void* Tensor::raw_data() const {
  if (storage_ == nullptr) return nullptr;
  return static_cast<const char*>(storage_->ptr) + byte_offset_;
}

absl::StatusOr<Tensor> Tensor::View(int64_t element_offset, Shape shape) const {
  const int64_t n = NumElements(shape);
  if (element_offset < 0 || n < 0 || element_offset + n > num_elements_) {
    return absl::OutOfRangeError(absl::StrCat("view of ", ShapeToString(shape), " at offset ",
                                              element_offset, " exceeds tensor of ",
                                              num_elements_, " elements"));
  }
  Tensor t = *this;
  t.byte_offset_ = byte_offset_ + element_offset * DTypeSize(dtype_);
  t.shape_ = std::move(shape);
  t.num_elements_ = n;
  return t;
}

absl::StatusOr<Tensor> Tensor::Reshape(Shape shape) const {
  if (NumElements(shape) != num_elements_) {
    return absl::InvalidArgumentError(absl::StrCat("cannot reshape ", ShapeToString(shape_),
                                                   " to ", ShapeToString(shape)));
  }
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

absl::Status Tensor::CopyToHost(absl::Span<float> out) const {
  if (dtype_ != DType::kF32 || static_cast<int64_t>(out.size()) != num_elements_) {
    return absl::InvalidArgumentError(absl::StrCat("CopyToHost: tensor ", ShapeToString(shape_),
                                                   " ", DTypeName(dtype_), " into ",
                                                   out.size(), " floats"));
  }
  return device_->CopyDeviceToHost(out.data(), raw_data(), num_bytes());
}

absl::Status Tensor::CopyFromHost(absl::Span<const float> values) {
  if (dtype_ != DType::kF32 || static_cast<int64_t>(values.size()) != num_elements_) {
    return absl::InvalidArgumentError(absl::StrCat("CopyFromHost: ", values.size(),
                                                   " floats into tensor ",
                                                   ShapeToString(shape_), " ", DTypeName(dtype_)));
  }
  return device_->CopyHostToDevice(mutable_raw_data(), values.data(), num_bytes());
}

absl::StatusOr<std::vector<float>> Tensor::ToVector() const {
  std::vector<float> out(num_elements_);
  PS_RETURN_IF_ERROR(CopyToHost(absl::MakeSpan(out)));
  return out;
}

absl::Status Tensor::CopyFrom(const Tensor& other) {
  if (other.device_ != device_ || other.num_bytes() != num_bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CopyFrom: ", ShapeToString(other.shape_), " on ",
                     other.device_ ? other.device_->name() : "none", " into ",
                     ShapeToString(shape_), " on ", device_ ? device_->name() : "none"));
  }
  return device_->CopyOnDevice(mutable_raw_data(), other.raw_data(), num_bytes());
}

absl::Status Tensor::SetZero() { return device_->Memzero(mutable_raw_data(), num_bytes()); }

}  // namespace ps
