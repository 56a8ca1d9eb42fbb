#include "server/server_flags.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_token.h"
#include "common/optimizer/optimizer.h"
#include "common/optimizer/optimizer_flags.h"
#include "common/status_macros.h"
#include "server/consistency/consistency.h"

ABSL_FLAG(std::string, bind_address, "127.0.0.1",
          "address to listen on (0.0.0.0 in containers)");
ABSL_FLAG(int, port, 50051, "port to listen on (0: pick a free one)");
ABSL_FLAG(std::string, advertise_address, "",
          "address workers should use, printed at start (default bind_address:port)");
ABSL_FLAG(std::string, port_file, "", "write the bound port here once serving (for launchers)");
ABSL_FLAG(int, num_workers, 1, "workers taking part in every synchronous iteration");
ABSL_FLAG(std::string, init_weights, "",
          "safetensors file with the initial parameters, matched to the workers' model by name "
          "(default: worker rank 0 sends its own)");
ABSL_FLAG(int64_t, chunk_bytes, ps::server::ParameterServerOptions::kDefaultChunkElements * 4,
          "largest tensor chunk per message, in bytes");
ABSL_FLAG(int, threads, 1, "CPU threads for the optimizer");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "write checkpoints here, and resume from the newest valid one at start");
ABSL_FLAG(int64_t, checkpoint_every_steps, 100,
          "with --checkpoint_dir: a checkpoint every this many versions (0: not by steps)");
ABSL_FLAG(absl::Duration, checkpoint_every, absl::ZeroDuration(),
          "with --checkpoint_dir: a checkpoint this often, e.g. 60s (0: not by time)");
ABSL_FLAG(int, checkpoint_keep, 3, "checkpoints kept (the newest)");
ABSL_FLAG(absl::Duration, stop_timeout, absl::Seconds(10),
          "on SIGTERM, how long to wait for the iteration in progress to end, for a final "
          "checkpoint at a version boundary");
ABSL_FLAG(absl::Duration, liveness_timeout, absl::Seconds(10),
          "a worker with no heartbeat or push for this long is lost");
ABSL_FLAG(absl::Duration, stall_report_every, absl::Seconds(5),
          "while an iteration waits for missing workers, report which ones this often");
ABSL_FLAG(std::string, consistency, "sync",
          "sync (every iteration sums all workers' pushes: one device's SGD on the global batch), "
          "async (each push applied as it arrives; workers never wait for each other) or ssp:S "
          "(stale synchronous parallel: sync's updates, but a worker may begin step t once every "
          "worker has pushed step t-S-1; ssp:0 is sync)");
ABSL_FLAG(std::string, optimizer, "sgd",
          "sgd: the server applies SGD (--lr, --momentum, --weight_decay, --nesterov, "
          "--lr_decay_*, --lr_warmup_steps) and each version is the parameters; none: a sum-only "
          "server, each version after 0 is the mean gradient of the iteration's global batch, "
          "which the workers apply with an optimizer of their own (ps.torch; docs/training.md); "
          "it refuses the SGD flags, --consistency=async and --loss_scale=dynamic");
ABSL_FLAG(std::string, on_worker_loss, "wait",
          "wait: wait for a lost worker to come back (it rejoins at its rank and the current "
          "step: bit-identical), up to --worker_loss_timeout, then fail the job; shrink: drop a "
          "worker lost for --liveness_timeout and go on with the others, the global batch split "
          "over them (same size); a returning worker rejoins at a step boundary");
ABSL_FLAG(absl::Duration, worker_loss_timeout, absl::Minutes(10),
          "with --on_worker_loss=wait: fail the job once a worker has been lost this long");
ABSL_FLAG(int64_t, grpc_memory_limit_mb, 4096,
          "memory gRPC may hold for calls in flight (a flood of large messages is refused "
          "RESOURCE_EXHAUSTED beyond it instead of growing the server)");
ABSL_FLAG(int, max_concurrent_streams, 1000, "calls in flight per client connection");
ABSL_FLAG(int64_t, max_push_lead_bytes, 0,
          "sync: while the slowest worker pushes, hold the replies to a worker more than this "
          "many gradient bytes ahead of it, so a shared link carries what can be summed "
          "(0: off)");
ABSL_FLAG(absl::Duration, push_lead_idle, absl::Milliseconds(20),
          "a slowest worker silent this long is computing: the others go on");
ABSL_FLAG(absl::Duration, push_hold_limit, absl::Seconds(1),
          "the longest a push reply is held by --max_push_lead_bytes");
ABSL_FLAG(std::string, tls_cert, "", "PEM server certificate: serve TLS (with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA: mutual TLS, every client must present a certificate it signed");
ABSL_FLAG(std::string, job_token_file, "",
          "file holding the job's shared token, required on every call (default: "
          "$PS_JOB_TOKEN; never a flag value, which `ps` would show)");
ABSL_FLAG(bool, insecure, false,
          "allow plaintext on an address other than loopback (anyone who reaches the port can "
          "then read and change the model)");
ABSL_FLAG(int, metrics_port, -1,
          "serve Prometheus metrics at http://--metrics_address:PORT/metrics (0: any free port, "
          "printed; -1: none)");
ABSL_FLAG(std::string, metrics_address, "127.0.0.1", "address the metrics endpoint binds");
ABSL_FLAG(int, health_port, -1,
          "also answer gRPC health checks (grpc.health.v1, nothing else) in plaintext on this "
          "port of --bind_address, for probes that cannot speak TLS such as the kubelet's gRPC "
          "probes (0: any free port, -1: none)");
ABSL_FLAG(std::string, trace, "",
          "write a Chrome trace-event timeline (Perfetto, chrome://tracing) of every push, "
          "update and pull here when stopped");
ABSL_FLAG(int64_t, trace_max_events, 1000000,
          "events --trace keeps; later ones are dropped and counted in the file");

namespace ps::server {
namespace {

// The numeric flags no code below may see out of range: each refused with
// its name, rather than read as "off" (a negative count), "no limit" (a
// negative size) or "at once" (a timeout of 0 or less).
absl::Status CheckNumericFlags() {
  std::vector<std::string> bad;
  auto positive = [&](const char* name, absl::Duration d) {
    if (d <= absl::ZeroDuration() || d == absl::InfiniteDuration()) {
      bad.push_back(absl::StrCat("--", name, "=", absl::FormatDuration(d),
                                 " (must be finite and > 0)"));
    }
  };
  positive("liveness_timeout", absl::GetFlag(FLAGS_liveness_timeout));
  positive("stall_report_every", absl::GetFlag(FLAGS_stall_report_every));
  positive("worker_loss_timeout", absl::GetFlag(FLAGS_worker_loss_timeout));
  positive("stop_timeout", absl::GetFlag(FLAGS_stop_timeout));
  if (absl::GetFlag(FLAGS_checkpoint_every) < absl::ZeroDuration()) {
    bad.push_back(absl::StrCat("--checkpoint_every=",
                               absl::FormatDuration(absl::GetFlag(FLAGS_checkpoint_every)),
                               " (must be >= 0; 0: not by time)"));
  }
  if (absl::GetFlag(FLAGS_checkpoint_every_steps) < 0) {
    bad.push_back(absl::StrCat("--checkpoint_every_steps=",
                               absl::GetFlag(FLAGS_checkpoint_every_steps),
                               " (must be >= 0; 0: not by steps)"));
  }
  if (absl::GetFlag(FLAGS_checkpoint_keep) < 1) {
    bad.push_back(absl::StrCat("--checkpoint_keep=", absl::GetFlag(FLAGS_checkpoint_keep),
                               " (must be >= 1)"));
  }
  // At most 1 TiB: the shift below stays far inside size_t.
  const int64_t memory_mb = absl::GetFlag(FLAGS_grpc_memory_limit_mb);
  if (memory_mb < 1 || memory_mb > (int64_t{1} << 20)) {
    bad.push_back(absl::StrCat("--grpc_memory_limit_mb=", memory_mb, " (must be 1 to 1048576)"));
  }
  if (absl::GetFlag(FLAGS_threads) < 1) {
    bad.push_back(absl::StrCat("--threads=", absl::GetFlag(FLAGS_threads), " (must be >= 1)"));
  }
  if (bad.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(bad, "; "));
}

// --optimizer and the optimizer's flags. A sum-only server applies no SGD:
// an SGD flag given with it would be ignored, so it is refused by name, and
// so are the modes in which a version would not be one whole iteration's
// mean gradient.
absl::Status OptimizerFromFlags(int argc, char** argv, ParameterServerOptions& job) {
  const std::string kind = absl::GetFlag(FLAGS_optimizer);
  if (kind == kSgdOptimizer) {
    PS_ASSIGN_OR_RETURN(job.optimizer, OptimizerOptionsFromFlags());
    return absl::OkStatus();
  }
  if (kind != kMeanGradientOptimizer) {
    return absl::InvalidArgumentError(
        absl::StrCat("--optimizer must be sgd or none, got '", kind, "'"));
  }
  const std::vector<std::string> given = SgdFlagsOnCommandLine(argc, argv);
  if (!given.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--optimizer=none publishes the mean gradient; ", absl::StrJoin(given, ", "),
        given.size() == 1 ? " applies" : " apply",
        " to --optimizer=sgd: drop ", given.size() == 1 ? "it" : "them",
        " (the workers' own optimizer takes its learning rate and the like)"));
  }
  PS_RETURN_IF_ERROR(CheckSumOnlyMode(*job.consistency, job.loss_scale.dynamic));
  job.optimizer = OptimizerOptions();
  job.optimizer.kind = kMeanGradientOptimizer;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ServerOptions> ServerOptionsFromFlags(int argc, char** argv) {
  PS_RETURN_IF_ERROR(CheckNumericFlags());
  ServerOptions options;
  ParameterServerOptions& job = options.job;
  job.num_workers = absl::GetFlag(FLAGS_num_workers);
  job.chunk_elements = absl::GetFlag(FLAGS_chunk_bytes) / 4;
  absl::StatusOr<std::shared_ptr<const Consistency>> consistency =
      ParseConsistency(absl::GetFlag(FLAGS_consistency));
  if (!consistency.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--consistency: ", consistency.status().message()));
  }
  job.consistency = *std::move(consistency);
  PS_ASSIGN_OR_RETURN(job.loss_scale, LossScaleOptionsFromFlags());
  PS_RETURN_IF_ERROR(OptimizerFromFlags(argc, argv, job));
  options.threads = absl::GetFlag(FLAGS_threads);
  options.init_weights = absl::GetFlag(FLAGS_init_weights);

  options.bind_address = absl::GetFlag(FLAGS_bind_address);
  options.port = absl::GetFlag(FLAGS_port);
  options.advertise_address = absl::GetFlag(FLAGS_advertise_address);
  options.port_file = absl::GetFlag(FLAGS_port_file);
  options.grpc_memory_limit_mb = absl::GetFlag(FLAGS_grpc_memory_limit_mb);
  options.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);

  options.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  options.checkpoint_every_steps = absl::GetFlag(FLAGS_checkpoint_every_steps);
  options.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  options.checkpoint_keep = absl::GetFlag(FLAGS_checkpoint_keep);
  options.stop_timeout = absl::GetFlag(FLAGS_stop_timeout);

  options.liveness_timeout = absl::GetFlag(FLAGS_liveness_timeout);
  options.stall_report_every = absl::GetFlag(FLAGS_stall_report_every);
  PS_ASSIGN_OR_RETURN(options.worker_loss,
                      ParseWorkerLossPolicy(absl::GetFlag(FLAGS_on_worker_loss),
                                            absl::GetFlag(FLAGS_worker_loss_timeout)));
  PS_RETURN_IF_ERROR(options.worker_loss->CheckConsistency(*job.consistency));

  options.max_push_lead_bytes = absl::GetFlag(FLAGS_max_push_lead_bytes);
  options.push_lead_idle = absl::GetFlag(FLAGS_push_lead_idle);
  options.push_hold_limit = absl::GetFlag(FLAGS_push_hold_limit);
  if (options.max_push_lead_bytes < 0 || options.push_lead_idle <= absl::ZeroDuration() ||
      options.push_hold_limit <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_push_lead_bytes must be >= 0, --push_lead_idle and --push_hold_limit > 0; got ",
        options.max_push_lead_bytes, ", ", absl::FormatDuration(options.push_lead_idle),
        " and ", absl::FormatDuration(options.push_hold_limit)));
  }

  options.tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  options.tls.key_file = absl::GetFlag(FLAGS_tls_key);
  options.tls.client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  PS_ASSIGN_OR_RETURN(options.job_token, ReadJobToken(absl::GetFlag(FLAGS_job_token_file),
                                                      std::getenv(kJobTokenEnvVar)));
  options.insecure = absl::GetFlag(FLAGS_insecure);

  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  options.metrics_address = absl::GetFlag(FLAGS_metrics_address);
  options.health_port = absl::GetFlag(FLAGS_health_port);
  options.trace = absl::GetFlag(FLAGS_trace);
  options.trace_max_events = absl::GetFlag(FLAGS_trace_max_events);
  return options;
}

}  // namespace ps::server
