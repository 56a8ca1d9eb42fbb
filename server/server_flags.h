#ifndef PS_SERVER_SERVER_FLAGS_H_
#define PS_SERVER_SERVER_FLAGS_H_

// The server daemon's command-line flags (defined in server_flags.cc, linked
// by main() only) and the one function that turns them into options.

#include "absl/status/statusor.h"
#include "server/server_options.h"

namespace ps::server {

// The options the parsed flags give, every value checked: kInvalidArgument
// naming each bad flag (a timeout of 0, a negative count, an unknown
// --consistency, --optimizer or --on_worker_loss, shrinking under a
// consistency that cannot shrink; with --optimizer=none, any SGD flag given,
// --consistency=async or --loss_scale=dynamic). Reads the job token from
// --job_token_file or $PS_JOB_TOKEN. `argc`/`argv` are main's, for which
// flags were given (a flag given at its default value is still refused
// where it does not apply).
absl::StatusOr<ServerOptions> ServerOptionsFromFlags(int argc, char** argv);

}  // namespace ps::server

#endif  // PS_SERVER_SERVER_FLAGS_H_
