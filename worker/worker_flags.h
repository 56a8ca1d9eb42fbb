#ifndef PS_WORKER_WORKER_FLAGS_H_
#define PS_WORKER_WORKER_FLAGS_H_

// The worker daemon's command-line flags (defined in worker_flags.cc, linked
// by main() only) and the one function that turns them into options.

#include "absl/status/statusor.h"
#include "worker/worker_options.h"

namespace ps::worker {

// The options the parsed flags give, every value checked: kInvalidArgument
// naming the first bad flag (--devices, --mlp_hidden, --linear_block_rows
// below 0, an optimizer flag given with --server, the optimizer's and loss
// scaling's own checks, --precision, --compute other than real or replay,
// --batch_size below 1, --check without --server). With --server, reads the
// job token from --job_token_file or $PS_JOB_TOKEN. `argc`/`argv` are
// main()'s: an optimizer flag named there is refused with --server even at
// its default value.
absl::StatusOr<WorkerOptions> WorkerOptionsFromFlags(int argc, char** argv);

}  // namespace ps::worker

#endif  // PS_WORKER_WORKER_FLAGS_H_
