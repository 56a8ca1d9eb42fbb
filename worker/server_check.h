#ifndef PS_WORKER_SERVER_CHECK_H_
#define PS_WORKER_SERVER_CHECK_H_

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/param_spec.h"
#include "common/tls_credentials.h"

namespace ps::worker {

// What `worker --check` tries against one server address, as this worker
// would connect: the name resolves, TCP connects, gRPC answers through the
// TLS settings and the job token, the server's model matches this
// worker's, and how fast a round trip and a pull are.
struct ServerCheckOptions {
  std::string address;  // host:port
  ClientTlsOptions tls;
  std::string job_token;
  // This worker's model (empty: not compared) and steps per epoch (0: not
  // compared).
  std::vector<ParamSpec> signature;
  int64_t steps_per_epoch = 0;
  absl::Duration timeout = absl::Seconds(5);  // per step
};

struct ServerCheckResult {
  bool ok = false;
  // One line per step, "ok: ..." or "FAIL: <what> -- <how to fix it>".
  std::vector<std::string> lines;
};

// Runs the steps in order, stopping at the first that fails (the later ones
// need it). Never changes the server's state: it registers nothing and
// pushes nothing (Describe and pulls only).
ServerCheckResult CheckServer(const ServerCheckOptions& options);

}  // namespace ps::worker

#endif  // PS_WORKER_SERVER_CHECK_H_
