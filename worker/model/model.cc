// The models of ModelConfig::name, built from the layers of layer.h and its
// family files (conv_layer.h, pool_layer.h, ...).
//
// Parameter names (torch state_dict keys; worker/model/torch_models.py holds
// the equivalent torch.nn modules, with exactly these keys, as a test oracle):
//
//   softmax:    fc.{weight,bias}
//   mlp:        fc1 .. fc<H>.{weight,bias} for the H hidden layers (each
//               followed by a ReLU), fc<H+1>.{weight,bias} the output layer
//   lenet,
//   lenet_relu: conv1, conv2, fc1, fc2, fc3 .{weight,bias}
//   resnet18,
//   resnet18_cifar:
//               b1.conv.{weight,bias}
//               b1.bn.{weight,bias,running_mean,running_var,num_batches_tracked}
//               stage<s>.block<b>.{conv1,conv2[,conv3]}.{weight,bias}
//               stage<s>.block<b>.{bn1,bn2}.{weight,bias,running_mean,...}
//                 s = 1..4 (64, 128, 256, 512 channels), b = 0, 1; conv3 is
//                 the 1x1 shortcut of block0 in stages 2..4
//               fc.{weight,bias}
//               The two differ only in the stem b1: resnet18's b1.conv is
//               7x7 (stride 2) and a 3x3/2 max pooling follows its ReLU;
//               resnet18_cifar's is 3x3 (stride 1) with no pooling. So the
//               names, and every shape but b1.conv.weight's, are the same.
//
// parameters() lists trainable tensors in torch's named_parameters() order
// and buffers() in named_buffers() order.

#include "worker/model/model.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "kernels/softmax_cross_entropy.h"
#include "worker/model/activation_layer.h"
#include "worker/model/batch_norm_layer.h"
#include "worker/model/conv_layer.h"
#include "worker/model/flatten_layer.h"
#include "worker/model/layer.h"
#include "worker/model/linear_layer.h"
#include "worker/model/parameter_set.h"
#include "worker/model/pool_layer.h"
#include "worker/model/profile_model.h"
#include "worker/model/residual_layer.h"
#include "worker/model/sequential.h"

namespace ps::worker::model {

int64_t TotalElements(const std::vector<ParamSpec>& specs) {
  int64_t total = 0;
  for (const ParamSpec& spec : specs) total += NumElements(spec.shape);
  return total;
}

namespace {

using ActKind = Activation::Kind;
using PoolKind = Pool2d::Kind;

std::unique_ptr<Sequential> BuildSoftmax(const ModelConfig& config, Device* device) {
  auto net = std::make_unique<Sequential>(device);
  net->Add("", std::make_unique<Flatten>(device));
  net->Add("fc", std::make_unique<Linear>(device, NumElements(config.input_shape),
                                          config.num_classes, config.linear_block_rows));
  return net;
}

std::unique_ptr<Sequential> BuildMlp(const ModelConfig& config, Device* device) {
  auto net = std::make_unique<Sequential>(device);
  net->Add("", std::make_unique<Flatten>(device));
  int64_t width = NumElements(config.input_shape);
  int index = 1;
  for (int64_t hidden : config.mlp_hidden) {
    net->Add(absl::StrCat("fc", index++),
             std::make_unique<Linear>(device, width, hidden, config.linear_block_rows));
    net->Add("", std::make_unique<Activation>(device, ActKind::kRelu));
    width = hidden;
  }
  net->Add(absl::StrCat("fc", index), std::make_unique<Linear>(device, width, config.num_classes,
                                                                config.linear_block_rows));
  return net;
}

// D2L's LeNet (section 7.6); `relu` swaps sigmoid for ReLU and average for
// max pooling.
std::unique_ptr<Sequential> BuildLeNet(const ModelConfig& config, Device* device, bool relu) {
  const ActKind act = relu ? ActKind::kRelu : ActKind::kSigmoid;
  const PoolKind pool = relu ? PoolKind::kMax : PoolKind::kAverage;
  auto net = std::make_unique<Sequential>(device);
  // Each convolution, activation and pooling runs as one fused layer (same
  // parameter names and results as the three in sequence).
  net->Add("conv1", std::make_unique<Conv2dActivationPool>(device, config.input_shape[0], 6, 5, 1,
                                                           2, act, pool, 2, 2));
  net->Add("conv2",
           std::make_unique<Conv2dActivationPool>(device, 6, 16, 5, 1, 0, act, pool, 2, 2));
  net->Add("", std::make_unique<Flatten>(device));
  net->Add("fc1", std::make_unique<Linear>(device, 16 * 5 * 5, 120));
  net->Add("", std::make_unique<Activation>(device, act));
  net->Add("fc2", std::make_unique<Linear>(device, 120, 84));
  net->Add("", std::make_unique<Activation>(device, act));
  net->Add("fc3", std::make_unique<Linear>(device, 84, config.num_classes));
  return net;
}

// Dive into Deep Learning's ResNet-18 in one of its two forms:
//  - kImageNet, "resnet18" (section 8.6): the stem b1 is a 7x7 convolution
//    of stride 2, batch norm, ReLU and 3x3/2 max pooling, which shrinks a
//    28x28 input to 7x7 before stage 1;
//  - kSmallImage, "resnet18_cifar" (section 13.6's "slightly modified
//    ResNet-18", the community's CIFAR variant): a 3x3 convolution of stride
//    1, batch norm and ReLU, no pooling, so stage 1 sees the full 28x28
//    (16 times the pixels of resnet18's 7x7; 12 to 16 times in the later
//    stages): 456 M multiply-adds a 28x28 sample against resnet18's 33 M.
// The four stages, pooling and classifier after the stem are the same.
enum class ResNetStem { kImageNet, kSmallImage };

std::unique_ptr<Sequential> BuildResNet18(const ModelConfig& config, Device* device,
                                          ResNetStem stem) {
  auto net = std::make_unique<Sequential>(device);
  auto b1 = std::make_unique<Sequential>(device);
  if (stem == ResNetStem::kImageNet) {
    b1->Add("conv", std::make_unique<Conv2d>(device, config.input_shape[0], 64, 7, 2, 3));
  } else {
    b1->Add("conv", std::make_unique<Conv2d>(device, config.input_shape[0], 64, 3, 1, 1));
  }
  b1->Add("bn", std::make_unique<BatchNorm>(device, 64, 2));
  b1->Add("", std::make_unique<Activation>(device, ActKind::kRelu));
  if (stem == ResNetStem::kImageNet) {
    b1->Add("", std::make_unique<Pool2d>(device, PoolKind::kMax, 3, 2, 1));
  }
  net->Add("b1", std::move(b1));
  const int64_t channels[] = {64, 128, 256, 512};
  int64_t in = 64;
  for (int s = 0; s < 4; ++s) {
    auto stage = std::make_unique<Sequential>(device);
    for (int b = 0; b < 2; ++b) {
      // The first block of every stage but the first halves the resolution
      // and changes the width, so its shortcut needs a strided 1x1 conv.
      const bool downsample = b == 0 && s > 0;
      stage->Add(
          absl::StrCat("block", b),
          std::make_unique<Residual>(device, in, channels[s], downsample, downsample ? 2 : 1));
      in = channels[s];
    }
    net->Add(absl::StrCat("stage", s + 1), std::move(stage));
  }
  net->Add("", std::make_unique<GlobalAvgPool2d>(device));
  net->Add("", std::make_unique<Flatten>(device));
  net->Add("fc", std::make_unique<Linear>(device, 512, config.num_classes));
  return net;
}

// Inputs must be [n, C, H, W] with [C, H, W] the configured sample shape.
absl::Status CheckBatch(const ModelConfig& config, const Tensor& inputs, const Tensor& labels,
                        Device* device) {
  const Shape& shape = inputs.shape();
  if (shape.size() != config.input_shape.size() + 1 || shape[0] < 1 ||
      !std::equal(config.input_shape.begin(), config.input_shape.end(), shape.begin() + 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", config.name, ": inputs of shape ", ShapeToString(shape),
                     ", expected [n, ", absl::StrJoin(config.input_shape, ", "), "] with n >= 1"));
  }
  if (inputs.dtype() != DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model ", config.name, ": inputs must be F32, got ", DTypeName(inputs.dtype())));
  }
  if (labels.num_elements() != shape[0] || labels.dtype() != DType::kI32) {
    return absl::InvalidArgumentError(absl::StrCat("model ", config.name, ": labels of shape ",
                                                   ShapeToString(labels.shape()), " ",
                                                   DTypeName(labels.dtype()), " for ", shape[0],
                                                   " inputs; expected ", shape[0], " I32 values"));
  }
  if (inputs.device() != device || labels.device() != device) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", config.name, " on ", device->name(),
                     ": inputs and labels must be on the same device"));
  }
  return absl::OkStatus();
}

// A Model over a layer tree. The DeviceMetrics a call returns point into
// metrics_ and stay valid until the next call of the same method; all
// activation buffers are kept between calls and grow with the batch.
class LayerModel final : public Model {
 public:
  LayerModel(ModelConfig config, Device* device, std::unique_ptr<Sequential> net,
             std::unique_ptr<ParameterSet> params, Tensor metrics)
      : Model(std::move(config), device),
        net_(std::move(net)),
        params_(std::move(params)),
        metrics_(std::move(metrics)) {
    net_->set_events(&events_);
  }

  const std::vector<ParamSpec>& parameters() const override { return params_->parameters(); }
  const std::vector<ParamSpec>& buffers() const override { return params_->buffers(); }
  Tensor& flat_parameters() override { return params_->flat_parameters(); }
  Tensor& flat_gradients() override { return params_->flat_gradients(); }
  Tensor& flat_buffers() override { return params_->flat_buffers(); }
  absl::StatusOr<Tensor> Find(const std::string& name) override { return params_->Find(name); }
  absl::Status Initialize(uint64_t seed) override { return params_->Initialize(seed); }
  void set_observer(EventObserver* observer, const Clock* clock, int32_t lane) override {
    events_.observer = observer;
    events_.clock = clock;
    events_.lane = lane;
  }
  void set_step(int64_t step) override { events_.step = step; }
  void set_parameter_hooks(ParameterHooks* hooks) override { hooks_ = hooks; }
  std::vector<int64_t> LayerParameterBegins() const override {
    return net_->ChildParameterBegins();
  }

  absl::StatusOr<DeviceMetrics> ForwardBackward(const Tensor& inputs,
                                                const Tensor& labels) override {
    PS_RETURN_IF_ERROR(CheckBatch(config(), inputs, labels, device()));
    // The hooks see this pass only, whatever way it returns.
    events_.hooks = hooks_;
    struct Unhook {
      LayerEvents* events;
      ~Unhook() { events->hooks = nullptr; }
    } unhook{&events_};
    PS_ASSIGN_OR_RETURN(Tensor logits, net_->Forward(inputs, Mode::kTraining));
    PS_ASSIGN_OR_RETURN(Tensor dlogits, dlogits_.Get(device(), logits.shape()));
    float* metrics = MutableF32(metrics_);
    PS_RETURN_IF_ERROR(kernels::SoftmaxCrossEntropy(
        *device(), logits.dim(0), logits.dim(1), logits.data<float>(), labels.data<int32_t>(),
        /*grad_scale=*/loss_scale(), &metrics[0], &metrics[1], MutableF32(dlogits)));
    PS_RETURN_IF_ERROR(net_->Backward(dlogits, /*need_dx=*/false).status());
    return DeviceMetrics{&metrics[0], &metrics[1]};
  }

  absl::StatusOr<DeviceMetrics> Evaluate(const Tensor& inputs, const Tensor& labels) override {
    PS_RETURN_IF_ERROR(CheckBatch(config(), inputs, labels, device()));
    PS_ASSIGN_OR_RETURN(Tensor logits, net_->Forward(inputs, Mode::kInference));
    // Separate slots from ForwardBackward's, so an evaluation does not
    // overwrite training metrics not yet read.
    float* metrics = MutableF32(metrics_);
    PS_RETURN_IF_ERROR(kernels::SoftmaxCrossEntropy(*device(), logits.dim(0), logits.dim(1),
                                                    logits.data<float>(), labels.data<int32_t>(),
                                                    1.0f, &metrics[2], &metrics[3],
                                                    /*dlogits=*/nullptr));
    return DeviceMetrics{&metrics[2], &metrics[3]};
  }

 private:
  std::unique_ptr<Sequential> net_;
  std::unique_ptr<ParameterSet> params_;
  Tensor metrics_;  // [4]: training loss_sum, correct; evaluation loss_sum, correct
  ActivationBuffer dlogits_;
  LayerEvents events_;  // net_ reports its layers' passes here
  ParameterHooks* hooks_ = nullptr;  // set into events_ during ForwardBackward
};

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> Model::Create(const ModelConfig& config, Device* device) {
  if (device == nullptr) return absl::InvalidArgumentError("Model::Create: null device");
  if (config.name == "profile") return CreateProfileModel(config, device);
  const Shape& in = config.input_shape;
  if (in.size() != 3 || in[0] < 1 || in[1] < 1 || in[2] < 1) {
    return absl::InvalidArgumentError(absl::StrCat("model ", config.name, ": input shape ",
                                                   ShapeToString(in),
                                                   " is not a sample shape [C, H, W]"));
  }
  if (config.num_classes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", config.name, ": num_classes ", config.num_classes, " < 1"));
  }
  std::unique_ptr<Sequential> net;
  if (config.name == "softmax") {
    net = BuildSoftmax(config, device);
  } else if (config.name == "mlp") {
    for (int64_t width : config.mlp_hidden) {
      if (width < 1) {
        return absl::InvalidArgumentError(absl::StrCat("model mlp: hidden width ", width, " < 1"));
      }
    }
    net = BuildMlp(config, device);
  } else if (config.name == "lenet" || config.name == "lenet_relu") {
    net = BuildLeNet(config, device, config.name == "lenet_relu");
  } else if (config.name == "resnet18") {
    net = BuildResNet18(config, device, ResNetStem::kImageNet);
  } else if (config.name == "resnet18_cifar") {
    net = BuildResNet18(config, device, ResNetStem::kSmallImage);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown model name \"", config.name,
                     "\"; known: softmax, mlp, lenet, lenet_relu, resnet18, resnet18_cifar, profile"));
  }

  // The architecture must map one sample to num_classes logits.
  Shape sample = {1};
  sample.insert(sample.end(), in.begin(), in.end());
  absl::StatusOr<Shape> out = net->OutputShape(sample);
  if (!out.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("model ", config.name,
                                                   " cannot take input shape ", ShapeToString(in),
                                                   ": ", out.status().message()));
  }
  if (*out != Shape{1, config.num_classes}) {
    return absl::InvalidArgumentError(absl::StrCat("model ", config.name, " with input shape ",
                                                   ShapeToString(in), " gives output ",
                                                   ShapeToString(*out)));
  }

  PS_ASSIGN_OR_RETURN(std::unique_ptr<ParameterSet> params, ParameterSet::Create(*net, device));
  PS_ASSIGN_OR_RETURN(Tensor metrics, Tensor::Zeros(device, {4}));
  return std::unique_ptr<Model>(
      new LayerModel(config, device, std::move(net), std::move(params), std::move(metrics)));
}

}  // namespace ps::worker::model
