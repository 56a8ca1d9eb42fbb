// The parameter-server daemon: holds named tensors and an optimizer, nothing
// of a model. It sums the pushes of --num_workers workers each iteration,
// applies SGD and serves the new version. The workers state the model: the
// first to register gives the signature, rank 0 the initial parameters
// (unless --init_weights gives them), and all the steps per epoch.
//
//   bazel run -c opt //server:server -- --num_workers=2 --lr=0.9

#include <arpa/inet.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/chrome_trace.h"
#include "common/clock.h"
#include "common/cpu_device.h"
#include "common/job_token.h"
#include "common/metrics.h"
#include "common/optimizer/optimizer_flags.h"
#include "common/process_tuning.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "common/tls_credentials.h"
#include "server/checkpoint.h"
#include "server/checkpointer.h"
#include "server/grpc_service.h"
#include "server/parameter_server.h"
#include "server/stall_report.h"

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
ABSL_FLAG(std::string, trace, "",
          "write a Chrome trace-event timeline (Perfetto, chrome://tracing) of every push, "
          "update and pull here when stopped");
ABSL_FLAG(int64_t, trace_max_events, 1000000,
          "events --trace keeps; later ones are dropped and counted in the file");

namespace ps::server {
namespace {

// The server's process in a timeline, apart from the workers' (pid = rank).
constexpr int64_t kServerTracePid = 1000000;

// The F32 tensors of a safetensors file. Others (PyTorch's I64
// num_batches_tracked, say) are buffers that live on the workers.
absl::StatusOr<std::vector<NamedTensor>> ReadInitialTensors(const std::string& path) {
  PS_ASSIGN_OR_RETURN(SafetensorsFile file, ReadSafetensors(path));
  std::vector<NamedTensor> tensors;
  for (const NamedHostTensor& t : file.tensors) {
    if (t.dtype != SafetensorsDType::kF32) continue;
    PS_ASSIGN_OR_RETURN(std::vector<float> values, t.ToFloats());
    tensors.push_back({t.name, t.shape, std::move(values)});
  }
  if (tensors.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " holds no F32 tensor"));
  }
  return tensors;
}

// Whether the bind address is a loopback one: localhost, an IPv4 address in
// 127.0.0.0/8, or ::1 (bracketed or not).
bool IsLoopback(const std::string& address) {
  if (address == "localhost" || address == "::1" || address == "[::1]") return true;
  in_addr ipv4;
  return inet_pton(AF_INET, address.c_str(), &ipv4) == 1 && (ntohl(ipv4.s_addr) >> 24) == 127;
}

// host:port for gRPC, an IPv6 host in brackets.
std::string HostPort(const std::string& host, int port) {
  const bool bare_ipv6 = host.find(':') != std::string::npos && host.front() != '[';
  return bare_ipv6 ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
}

void Log(const std::string& line) {
  std::printf("server: %s\n", line.c_str());
  std::fflush(stdout);
}

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

// The parameter server this process serves, and where its parameters come
// from.
struct StartedServer {
  std::unique_ptr<ParameterServer> server;
  std::string initial_from = "worker rank 0";  // for the start line
  int64_t resumed_version = -1;                // the checkpoint's, -1 when none
};

// Resumed from the newest valid checkpoint in `checkpoint_dir` (of this
// `job`: another job's is refused, naming the differences, as is a
// directory that holds checkpoints but no valid one), else started from
// --init_weights, else waiting for worker rank 0's parameters.
absl::StatusOr<StartedServer> CreateOrResume(const ParameterServerOptions& options,
                                             const std::string& checkpoint_dir,
                                             const std::map<std::string, std::string>& job,
                                             CpuDevice* device) {
  StartedServer started;
  if (!checkpoint_dir.empty()) {
    std::vector<std::string> refused;
    absl::StatusOr<LoadedCheckpoint> loaded = LoadNewestCheckpoint(checkpoint_dir, &refused);
    for (const std::string& why : refused) Log(absl::StrCat("refused checkpoint: ", why));
    if (loaded.ok()) {
      const std::string differences = JobDifferences(loaded->contents.job, job);
      if (!differences.empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            loaded->manifest_path, " is of another job (", differences,
            "): start with the same settings, or another --checkpoint_dir"));
      }
      ParameterServer::State state;
      state.version = loaded->contents.version;
      state.steps_per_epoch = loaded->contents.steps_per_epoch;
      state.signature = std::move(loaded->contents.signature);
      state.parameters = std::move(loaded->contents.parameters);
      state.momentum = std::move(loaded->contents.momentum);
      state.loss_scale = loaded->contents.loss_scale;
      state.loss_scale_clean_iterations = loaded->contents.loss_scale_clean_iterations;
      state.loss_scale_skipped_iterations = loaded->contents.loss_scale_skipped_iterations;
      absl::StatusOr<std::unique_ptr<ParameterServer>> resumed =
          ParameterServer::CreateFromState(options, std::move(state), device);
      if (!resumed.ok()) {
        // Named: the file a server cannot resume from (non-finite values
        // of a diverged run, say), for the operator to move aside.
        return absl::Status(resumed.status().code(),
                            absl::StrCat(loaded->manifest_path, ": cannot resume from it: ",
                                         resumed.status().message()));
      }
      started.server = *std::move(resumed);
      started.resumed_version = started.server->version();
      started.initial_from = absl::StrCat(loaded->manifest_path, " (resumed at version ",
                                          started.resumed_version, ")");
      return started;
    }
    if (loaded.status().code() != absl::StatusCode::kNotFound) {
      // Checkpoints exist but none is valid: starting afresh would throw
      // the job away, so say so and stop.
      return loaded.status();
    }
  }
  const std::string init_weights = absl::GetFlag(FLAGS_init_weights);
  if (init_weights.empty()) {
    PS_ASSIGN_OR_RETURN(started.server, ParameterServer::Create(options, device));
    return started;
  }
  PS_ASSIGN_OR_RETURN(std::vector<NamedTensor> initial, ReadInitialTensors(init_weights));
  started.initial_from = absl::StrCat(init_weights, " (", initial.size(), " tensors)");
  PS_ASSIGN_OR_RETURN(started.server,
                      ParameterServer::CreateFromNamedTensors(options, std::move(initial), device));
  return started;
}

absl::Status Main() {
  PS_RETURN_IF_ERROR(CheckNumericFlags());
  // SIGINT/SIGTERM are blocked in every thread (gRPC's inherit the mask) and
  // taken synchronously by sigwait below, so shutdown runs on this thread.
  const sigset_t stop_signals = BlockStopSignals();

  CpuDevice device(0, std::max(1, absl::GetFlag(FLAGS_threads)));

  std::unique_ptr<ChromeTraceObserver> trace;
  if (!absl::GetFlag(FLAGS_trace).empty()) {
    ChromeTraceOptions trace_options;
    trace_options.pid = kServerTracePid;
    trace_options.process_name = "server";
    trace_options.max_events = absl::GetFlag(FLAGS_trace_max_events);
    trace = std::make_unique<ChromeTraceObserver>(trace_options);
  }

  ParameterServerOptions options;
  options.num_workers = absl::GetFlag(FLAGS_num_workers);
  options.chunk_elements = absl::GetFlag(FLAGS_chunk_bytes) / 4;
  absl::StatusOr<std::shared_ptr<const Consistency>> consistency =
      ParseConsistency(absl::GetFlag(FLAGS_consistency));
  if (!consistency.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--consistency: ", consistency.status().message()));
  }
  options.consistency = *std::move(consistency);
  PS_ASSIGN_OR_RETURN(options.optimizer, OptimizerOptionsFromFlags());
  PS_ASSIGN_OR_RETURN(options.loss_scale, LossScaleOptionsFromFlags());
  // Metrics: the timed events, the calls' codes, and the job's state.
  std::unique_ptr<MetricsServer> metrics;
  std::unique_ptr<EventMetrics> event_metrics;
  ObserverFanOut observers;
  if (trace != nullptr) observers.Add(trace.get());
  if (absl::GetFlag(FLAGS_metrics_port) >= 0) {
    PS_ASSIGN_OR_RETURN(metrics, MetricsServer::Start(absl::StrCat(
                                     absl::GetFlag(FLAGS_metrics_address), ":",
                                     absl::GetFlag(FLAGS_metrics_port))));
    event_metrics = std::make_unique<EventMetrics>(metrics->registry(), "ps_server");
    observers.Add(event_metrics.get());
    std::printf("metrics at http://%s:%d/metrics\n", absl::GetFlag(FLAGS_metrics_address).c_str(),
                metrics->port());
    std::fflush(stdout);
  }
  options.observer = observers.empty() ? nullptr : &observers;
  const std::string checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  const std::map<std::string, std::string> job = JobSettings(options);
  PS_ASSIGN_OR_RETURN(StartedServer started, CreateOrResume(options, checkpoint_dir, job, &device));
  std::unique_ptr<ParameterServer> server = std::move(started.server);
  const std::string& initial_from = started.initial_from;
  const int64_t resumed_version = started.resumed_version;

  ServerTlsOptions tls;
  tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  tls.key_file = absl::GetFlag(FLAGS_tls_key);
  tls.client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  PS_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                      MakeServerCredentials(tls));
  const std::string bind_address = absl::GetFlag(FLAGS_bind_address);
  if (!UsesTls(tls) && !IsLoopback(bind_address) && !absl::GetFlag(FLAGS_insecure)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing to serve plaintext on ", bind_address,
        ": give --tls_cert/--tls_key (and --tls_client_ca for mutual TLS), or --insecure on a "
        "network you trust"));
  }
  const std::string on_worker_loss = absl::GetFlag(FLAGS_on_worker_loss);
  if (on_worker_loss != "wait" && on_worker_loss != "shrink") {
    return absl::InvalidArgumentError(
        absl::StrCat("--on_worker_loss=", on_worker_loss, ": use wait or shrink"));
  }
  const bool shrink = on_worker_loss == "shrink";
  if (shrink) {
    if (absl::Status can = options.consistency->CheckCanShrink(); !can.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--on_worker_loss=shrink with --consistency=", options.consistency->Name(),
                       " is not supported: ", can.message()));
    }
  }
  ServiceOptions service_options;
  service_options.shrinks = shrink;
  prometheus::Family<prometheus::Counter>* rpcs = nullptr;
  prometheus::Family<prometheus::Gauge>* job_gauges = nullptr;
  prometheus::Family<prometheus::Gauge>* worker_gauges = nullptr;
  prometheus::Family<prometheus::Gauge>* phase_sum = nullptr;
  prometheus::Family<prometheus::Gauge>* phase_count = nullptr;
  if (metrics != nullptr) {
    rpcs = &prometheus::BuildCounter()
                .Name("ps_server_rpcs_total")
                .Help("Calls answered, by method and status code")
                .Register(metrics->registry());
    job_gauges = &prometheus::BuildGauge()
                      .Name("ps_server_job")
                      .Help("The job as the server sees it: version, registered and live "
                            "workers, seconds since the last checkpoint, waiting pulls")
                      .Register(metrics->registry());
    worker_gauges = &prometheus::BuildGauge()
                         .Name("ps_worker")
                         .Help("Each worker as its heartbeats report it: steps trained")
                         .Register(metrics->registry());
    phase_sum = &prometheus::BuildGauge()
                     .Name("ps_worker_phase_seconds_sum")
                     .Help("Seconds each worker spent in each step phase (data, compute, "
                           "reduce, copy, push, wait, pull), from its heartbeats")
                     .Register(metrics->registry());
    phase_count = &prometheus::BuildGauge()
                       .Name("ps_worker_phase_seconds_count")
                       .Help("Times each worker went through each step phase")
                       .Register(metrics->registry());
    prometheus::Histogram* staleness =
        &prometheus::BuildHistogram()
             .Name("ps_server_push_staleness")
             .Help("Asynchronous consistency: updates a push's chunks had received since the "
                   "version it was computed from; ssp:S: iterations before the pushed one whose "
                   "updates its parameters lacked")
             .Register(metrics->registry())
             .Add({}, prometheus::Histogram::BucketBoundaries{0, 1, 2, 4, 8, 16, 32, 64, 128});
    service_options.on_staleness = [staleness](int64_t s) {
      staleness->Observe(static_cast<double>(s));
    };
    service_options.on_answer = [rpcs](absl::string_view method, absl::StatusCode code) {
      rpcs->Add({{"method", std::string(method)}, {"code", absl::StatusCodeToString(code)}})
          .Increment();
    };
  }
  service_options.stall_report_after = absl::GetFlag(FLAGS_stall_report_every);
  service_options.liveness_timeout = absl::GetFlag(FLAGS_liveness_timeout);
  service_options.max_push_lead_bytes = absl::GetFlag(FLAGS_max_push_lead_bytes);
  service_options.push_lead_idle = absl::GetFlag(FLAGS_push_lead_idle);
  service_options.push_hold_limit = absl::GetFlag(FLAGS_push_hold_limit);
  if (service_options.max_push_lead_bytes < 0 ||
      service_options.push_lead_idle <= absl::ZeroDuration() ||
      service_options.push_hold_limit <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_push_lead_bytes must be >= 0, --push_lead_idle and --push_hold_limit > 0; got ",
        service_options.max_push_lead_bytes, ", ",
        absl::FormatDuration(service_options.push_lead_idle), " and ",
        absl::FormatDuration(service_options.push_hold_limit)));
  }
  PS_ASSIGN_OR_RETURN(service_options.job_token,
                      ReadJobToken(absl::GetFlag(FLAGS_job_token_file),
                                   std::getenv(kJobTokenEnvVar)));
  ParameterServerService service(server.get(), service_options);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(HostPort(bind_address, absl::GetFlag(FLAGS_port)), credentials,
                           &port);
  builder.RegisterService(&service);
  // Bounds a hostile or broken client cannot grow past: gRPC's buffers for
  // calls in flight, and the calls one connection may have open.
  grpc::ResourceQuota quota("ps-server");
  quota.Resize(static_cast<size_t>(absl::GetFlag(FLAGS_grpc_memory_limit_mb)) << 20);
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             absl::GetFlag(FLAGS_max_concurrent_streams));
  std::unique_ptr<grpc::Server> grpc_server = builder.BuildAndStart();
  if (grpc_server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ",
                                               absl::GetFlag(FLAGS_bind_address), ":",
                                               absl::GetFlag(FLAGS_port)));
  }
  grpc_server->GetHealthCheckService()->SetServingStatus(true);
  const std::string advertised = absl::GetFlag(FLAGS_advertise_address).empty()
                                     ? HostPort(bind_address, port)
                                     : absl::GetFlag(FLAGS_advertise_address);
  const std::string security =
      UsesTls(tls) ? (tls.client_ca_file.empty() ? "TLS" : "mutual TLS")
                   : (IsLoopback(bind_address) ? "plaintext (loopback)"
                                               : "INSECURE plaintext (--insecure)");
  std::printf("parameter server for %d workers (%s) at %s, %s%s, initial parameters from %s\n",
              options.num_workers, options.consistency->Name().c_str(), advertised.c_str(),
              security.c_str(),
              service_options.job_token.empty() ? "" : ", job token required",
              initial_from.c_str());
  if (!IsLoopback(bind_address)) {
    // Allowed, but said: what is left open.
    if (UsesTls(tls) && tls.client_ca_file.empty() && service_options.job_token.empty()) {
      Log("warning: TLS without --tls_client_ca or a job token: anyone who reaches the port "
          "can register as a worker and pull the model");
    }
    if (!UsesTls(tls) && !service_options.job_token.empty()) {
      Log("warning: the job token crosses the network in plaintext (--insecure)");
    }
  }
  std::fflush(stdout);
  std::unique_ptr<Checkpointer> checkpointer;
  if (!checkpoint_dir.empty()) {
    CheckpointerOptions checkpoints;
    checkpoints.files.directory = checkpoint_dir;
    checkpoints.files.keep = absl::GetFlag(FLAGS_checkpoint_keep);
    checkpoints.every_steps = absl::GetFlag(FLAGS_checkpoint_every_steps);
    checkpoints.every = absl::GetFlag(FLAGS_checkpoint_every);
    checkpoints.job = job;
    checkpoints.log = Log;
    checkpointer = std::make_unique<Checkpointer>(server.get(), checkpoints, resumed_version);
  }
  if (!absl::GetFlag(FLAGS_port_file).empty()) {
    FILE* f = std::fopen(absl::GetFlag(FLAGS_port_file).c_str(), "w");
    if (f == nullptr) return absl::UnavailableError("cannot write --port_file");
    std::fprintf(f, "%d\n", port);
    std::fclose(f);
  }

  // The stall inspector: while an iteration waits for missing workers, says
  // which and what they last did; under the wait policy, fails the job once
  // a worker has been lost for --worker_loss_timeout (then stops the server
  // as a signal would).
  absl::Notification stop_inspector;
  std::atomic<bool> job_failed{false};
  std::thread inspector([&] {
    const Clock* clock = Clock::Real();
    int64_t last_report_ns = -1;
    const absl::Duration every = absl::GetFlag(FLAGS_stall_report_every);
    const absl::Duration loss_timeout = absl::GetFlag(FLAGS_worker_loss_timeout);
    while (!stop_inspector.WaitForNotificationWithTimeout(absl::Seconds(1))) {
      const ParameterServer::Progress progress = server->progress();
      const int64_t now = clock->NowNanos();
      if (job_gauges != nullptr) {
        int registered = 0, live = 0;
        for (const ParameterServer::WorkerProgress& w : progress.workers) {
          if (w.id.empty()) continue;
          ++registered;
          live += w.heard_ns >= 0 &&
                  now - w.heard_ns <= absl::ToInt64Nanoseconds(absl::GetFlag(FLAGS_liveness_timeout));
        }
        job_gauges->Add({{"what", "version"}}).Set(static_cast<double>(progress.version));
        job_gauges->Add({{"what", "registered_workers"}}).Set(registered);
        job_gauges->Add({{"what", "live_workers"}}).Set(live);
        job_gauges->Add({{"what", "waiting_pulls"}})
            .Set(static_cast<double>(service.waiting_pulls()));
        if (checkpointer != nullptr) {
          job_gauges->Add({{"what", "checkpoint_age_seconds"}})
              .Set(absl::ToDoubleSeconds(absl::Now() - checkpointer->last_write_time()));
        }
        // The workers' step phases, as their heartbeats reported them.
        for (const auto& [rank, report] : service.worker_reports()) {
          const std::string r = std::to_string(rank);
          worker_gauges->Add({{"rank", r}, {"what", "steps"}}).Set(static_cast<double>(report.steps()));
          for (const proto::PhaseTotal& phase : report.phases()) {
            phase_sum->Add({{"rank", r}, {"phase", phase.phase()}}).Set(phase.seconds());
            phase_count->Add({{"rank", r}, {"phase", phase.phase()}})
                .Set(static_cast<double>(phase.count()));
          }
        }
      }
      // Whom the iteration waits for, at once (a lost worker is acted on
      // after --liveness_timeout, whatever the report's period); the report
      // itself once it has waited --stall_report_every, and that often.
      const Stall stall = FindStall(progress, now, /*report_after=*/absl::ZeroDuration(),
                                    absl::GetFlag(FLAGS_liveness_timeout));
      if (stall.report.empty()) continue;
      if (stall.waited >= every &&
          (last_report_ns < 0 || now - last_report_ns >= absl::ToInt64Nanoseconds(every))) {
        Log(stall.report);
        last_report_ns = now;
      }
      for (const int rank : stall.lost) {
        const ParameterServer::WorkerProgress& w = progress.workers[rank];
        if (shrink) {
          // Lost past the liveness timeout, which is the grace period.
          if (w.id.empty()) continue;  // never came: the job waits for it
          const absl::Status dropped = service.DropWorker(rank);
          Log(dropped.ok()
                  ? absl::StrCat("dropped rank ", rank, " ('", w.id, "'), lost at iteration ",
                                 progress.version, ": the job goes on without it (its missing "
                                 "part of this iteration, and of the next if already announced, "
                                 "left out), the global batch split over the others; it rejoins "
                                 "at a step boundary if it comes back")
                  : absl::StrCat("cannot drop rank ", rank, ": ", dropped.message()));
          continue;
        }
        if (w.id.empty() || w.heard_ns < 0 ||
            now - w.heard_ns < absl::ToInt64Nanoseconds(loss_timeout)) {
          continue;
        }
        const absl::Status failure = absl::FailedPreconditionError(absl::StrCat(
            "job failed: worker rank ", rank, " ('", w.id, "') lost for ",
            absl::FormatDuration(absl::Trunc(absl::Nanoseconds(now - w.heard_ns),
                                              absl::Milliseconds(100))),
            " at iteration ", progress.version, " (--on_worker_loss=wait, --worker_loss_timeout=",
            absl::FormatDuration(loss_timeout), ")"));
        Log(std::string(failure.message()));
        service.FailJob(failure);
        job_failed = true;
        kill(getpid(), SIGTERM);
        return;
      }
    }
  });

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  stop_inspector.Notify();
  inspector.join();
  std::printf("parameter server stopping at version %lld (%s)\n",
              static_cast<long long>(server->version()), strsignal(signal_number));
  std::fflush(stdout);
  // 1. A final checkpoint at the next version boundary: the workers go on
  //    until the iteration in progress ends (bounded by --stop_timeout).
  if (checkpointer != nullptr) {
    const absl::Status final_checkpoint =
        checkpointer->WriteFinal(absl::Now() + absl::GetFlag(FLAGS_stop_timeout));
    if (!final_checkpoint.ok()) {
      Log(absl::StrCat("no final checkpoint (the newest is of version ",
                       checkpointer->last_version(), "): ", final_checkpoint.message()));
    }
  }
  // 2. Refuse everything from now on with UNAVAILABLE "shutting down", which
  //    workers take as a reason to reconnect, then answer the waiting pulls
  //    and stop within 2 s whatever the clients do.
  service.StopServing(absl::StrCat("received ", strsignal(signal_number)));
  service.Shutdown();
  grpc_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (trace != nullptr) {
    // After Shutdown no call is in flight: every event is in.
    PS_RETURN_IF_ERROR(trace->WriteTo(absl::GetFlag(FLAGS_trace)));
    std::printf("wrote the timeline (%lld events, %lld dropped) to %s\n",
                static_cast<long long>(trace->size()), static_cast<long long>(trace->dropped()),
                absl::GetFlag(FLAGS_trace).c_str());
  }
  if (job_failed) return absl::FailedPreconditionError("the job failed: a worker was lost");
  return absl::OkStatus();
}

}  // namespace
}  // namespace ps::server

int main(int argc, char** argv) {
  ps::TuneMallocForLargeMessages();
  ps::DisableMutexDeadlockDetection();
  absl::SetProgramUsageMessage("Synchronous parameter server. See README.md.");
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = ps::server::Main();
  if (!status.ok()) {
    std::fprintf(stderr, "server: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
