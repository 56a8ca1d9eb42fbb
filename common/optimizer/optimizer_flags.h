#ifndef PS_COMMON_OPTIMIZER_OPTIMIZER_FLAGS_H_
#define PS_COMMON_OPTIMIZER_OPTIMIZER_FLAGS_H_

// The optimizer's command-line flags, defined once for both daemons: the
// server (which owns the optimizer of a parameter-server job) and the worker
// (which runs it in process when it trains alone). Only main() functions
// link this library and call these functions; other libraries take
// OptimizerOptions.
//
//   --lr --momentum --weight_decay --nesterov
//   --lr_decay_every --lr_decay_gamma --lr_decay_unit --lr_warmup_steps
//   --loss_scale --loss_scale_initial --loss_scale_growth_interval
//
// The server's --optimizer (sgd, or none: the sum-only server, which takes
// none of SGD's flags) is the server's alone (server/server_flags.cc).

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/optimizer/loss_scale.h"
#include "common/optimizer/optimizer.h"

namespace ps {

// The options the flags give, validated (kInvalidArgument names the flag).
// The schedule's steps_per_epoch is left at its default: the caller knows it
// (the worker from its data, the server from the workers' registrations).
absl::StatusOr<OptimizerOptions> OptimizerOptionsFromFlags();

// Dynamic loss scaling's options from --loss_scale (none or dynamic),
// --loss_scale_initial and --loss_scale_growth_interval, validated
// (kInvalidArgument names the flag).
absl::StatusOr<LossScaleOptions> LossScaleOptionsFromFlags();

// The optimizer flags that `argv` (main's, before or after parsing) names or
// that hold a value other than their default, as "--lr", in definition
// order; empty when none is given.
std::vector<std::string> OptimizerFlagsOnCommandLine(int argc, char** argv);
// The same of SGD's flags only (--lr to --lr_warmup_steps: none of loss
// scaling's), which a server with --optimizer=none refuses.
std::vector<std::string> SgdFlagsOnCommandLine(int argc, char** argv);

}  // namespace ps

#endif  // PS_COMMON_OPTIMIZER_OPTIMIZER_FLAGS_H_
