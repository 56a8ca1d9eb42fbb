#include "common/optimizer/optimizer_flags.h"

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/types/span.h"
#include "common/status_macros.h"

ABSL_FLAG(double, lr, 0.9, "base learning rate");
ABSL_FLAG(double, momentum, 0.0, "SGD momentum");
ABSL_FLAG(double, weight_decay, 0.0, "L2 weight decay");
ABSL_FLAG(bool, nesterov, false, "Nesterov momentum");
ABSL_FLAG(int64_t, lr_decay_every, 0,
          "decay the learning rate every this many epochs/steps (0: never)");
ABSL_FLAG(double, lr_decay_gamma, 0.1, "learning-rate decay factor");
ABSL_FLAG(std::string, lr_decay_unit, "epochs", "epochs or steps");
ABSL_FLAG(int64_t, lr_warmup_steps, 0,
          "linear warm-up: update s of the first N uses (s + 1) / N of the rate (Goyal et al.: "
          "with the rate scaled with the global batch); 0: none");

ABSL_FLAG(std::string, loss_scale, "none",
          "none, or dynamic: loss scaling for fp16 workers (--precision=fp16), decided by the "
          "optimizer's owner (the servers; a worker without --server): workers multiply the "
          "loss by the published scale; a step in which any worker's gradient overflows is "
          "skipped by all and the scale halves; it doubles after --loss_scale_growth_interval "
          "clean steps (sync only)");
ABSL_FLAG(double, loss_scale_initial, 65536,
          "dynamic loss scaling's first scale (a power of 2, 2^-24 to 2^24)");
ABSL_FLAG(int64_t, loss_scale_growth_interval, 2000,
          "clean steps in a row after which the dynamic loss scale doubles");

namespace ps {

absl::StatusOr<LossScaleOptions> LossScaleOptionsFromFlags() {
  const std::string mode = absl::GetFlag(FLAGS_loss_scale);
  if (mode != "none" && mode != "dynamic") {
    return absl::InvalidArgumentError(
        absl::StrCat("--loss_scale must be none or dynamic, got '", mode, "'"));
  }
  LossScaleOptions options;
  options.dynamic = mode == "dynamic";
  options.initial = static_cast<float>(absl::GetFlag(FLAGS_loss_scale_initial));
  options.growth_interval = absl::GetFlag(FLAGS_loss_scale_growth_interval);
  if (absl::Status s = ValidateLossScaleOptions(options); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("loss scaling flags: ", s.message()));
  }
  return options;
}

absl::StatusOr<OptimizerOptions> OptimizerOptionsFromFlags() {
  OptimizerOptions options;
  options.sgd.lr = static_cast<float>(absl::GetFlag(FLAGS_lr));
  options.sgd.momentum = static_cast<float>(absl::GetFlag(FLAGS_momentum));
  options.sgd.weight_decay = static_cast<float>(absl::GetFlag(FLAGS_weight_decay));
  options.sgd.nesterov = absl::GetFlag(FLAGS_nesterov);
  options.schedule.step_size = absl::GetFlag(FLAGS_lr_decay_every);
  options.schedule.gamma = static_cast<float>(absl::GetFlag(FLAGS_lr_decay_gamma));
  options.schedule.warmup_steps = absl::GetFlag(FLAGS_lr_warmup_steps);
  PS_ASSIGN_OR_RETURN(options.schedule.unit,
                      ParseLrScheduleUnit(absl::GetFlag(FLAGS_lr_decay_unit)));
  if (absl::Status s = ValidateOptimizerOptions(options); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer flags: ", s.message()));
  }
  return options;
}

namespace {

// The flags of SGD's settings, and of loss scaling, in definition order.
constexpr const char* kSgdFlags[] = {"lr",             "momentum",       "weight_decay",
                                     "nesterov",       "lr_decay_every", "lr_decay_gamma",
                                     "lr_decay_unit",  "lr_warmup_steps"};
constexpr const char* kLossScaleFlags[] = {"loss_scale", "loss_scale_initial",
                                           "loss_scale_growth_interval"};

// Appends "--name" to `given` for each of `names` that argv names or that
// holds a value other than its default.
void AppendGiven(absl::Span<const char* const> names, int argc, char** argv,
                 std::vector<std::string>* given) {
  for (const char* name : names) {
    // Debian's abseil keeps CommandLineFlag::IsSpecifiedOnCommandLine
    // private, so look at argv (as abseil spells flags: -x, --x, --x=v,
    // --nox) and at the value (for --flagfile and the like).
    bool named = false;
    for (int i = 1; i < argc && !named; ++i) {
      absl::string_view arg = argv[i];
      if (arg == "--") break;
      if (!absl::ConsumePrefix(&arg, "--")) absl::ConsumePrefix(&arg, "-");
      named = arg == name || absl::StartsWith(arg, absl::StrCat(name, "=")) ||
              arg == absl::StrCat("no", name);
    }
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (named || (flag != nullptr && flag->CurrentValue() != flag->DefaultValue())) {
      given->push_back(absl::StrCat("--", name));
    }
  }
}

}  // namespace

std::vector<std::string> SgdFlagsOnCommandLine(int argc, char** argv) {
  std::vector<std::string> given;
  AppendGiven(kSgdFlags, argc, argv, &given);
  return given;
}

std::vector<std::string> OptimizerFlagsOnCommandLine(int argc, char** argv) {
  std::vector<std::string> given = SgdFlagsOnCommandLine(argc, argv);
  AppendGiven(kLossScaleFlags, argc, argv, &given);
  return given;
}

}  // namespace ps
