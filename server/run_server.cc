#include "server/run_server.h"

#include <arpa/inet.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/chrome_trace.h"
#include "common/clock.h"
#include "common/cpu_device.h"
#include "common/metrics.h"
#include "common/optimizer/optimizer.h"
#include "common/page_faults.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "common/tls_credentials.h"
#include "server/checkpoint.h"
#include "server/checkpointer.h"
#include "server/grpc_service.h"
#include "server/health_listener.h"
#include "server/job_supervisor.h"
#include "server/job_run.h"
#include "server/parameter_server.h"
#include "server/serving_control.h"

namespace ps::server {

void StopRequest::Request(std::string reason) {
  absl::MutexLock lock(&mu_);
  if (reason_.has_value()) return;
  reason_ = std::move(reason);
  if (on_request_) on_request_(*reason_);
}

void StopRequest::OnRequest(std::function<void(const std::string&)> on_request) {
  absl::MutexLock lock(&mu_);
  on_request_ = std::move(on_request);
  if (on_request_ && reason_.has_value()) on_request_(*reason_);
}

std::string StopRequest::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](std::optional<std::string>* reason) { return reason->has_value(); }, &reason_));
  return *reason_;
}

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

// The parameter server this process serves, and where its parameters come
// from.
struct StartedServer {
  std::unique_ptr<ParameterServer> server;
  std::string initial_from = "worker rank 0";  // for the start line
  int64_t resumed_version = -1;                // the checkpoint's, -1 when none
  std::string job_run;                         // the checkpoint's, "" when none
};

// Resumed from the newest valid checkpoint in `checkpoint_dir` (of this
// `job`: another job's is refused, naming the differences, as is a
// directory that holds checkpoints but no valid one), else started from
// `init_weights`, else waiting for worker rank 0's parameters.
absl::StatusOr<StartedServer> CreateOrResume(const ParameterServerOptions& options,
                                             const std::string& checkpoint_dir,
                                             const std::string& init_weights,
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
      if (auto run = loaded->contents.job.find(kJobRunSetting); run != loaded->contents.job.end()) {
        started.job_run = run->second;
      }
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

// The job's state as Prometheus gauges (version, workers registered and
// live, waiting pulls, the checkpoint's age, minor page faults per step,
// each worker's step phases as its heartbeats report them), the process's
// minor page faults, and the service's hooks for the calls' codes and the
// pushes' staleness.
class JobMetrics {
 public:
  JobMetrics(prometheus::Registry* registry, ServiceOptions* service_options)
      : rpcs_(RegisterFamily(prometheus::BuildCounter(), "ps_server_rpcs_total",
                             "Calls answered, by method and status code", *registry)),
        job_(RegisterFamily(prometheus::BuildGauge(), "ps_server_job",
                            "The job as the server sees it: version, registered and live "
                            "workers, seconds since the last checkpoint, waiting pulls",
                            *registry)),
        workers_(RegisterFamily(prometheus::BuildGauge(), "ps_worker",
                                "Each worker as its heartbeats report it: steps trained",
                                *registry)),
        phase_sum_(RegisterFamily(prometheus::BuildGauge(), "ps_worker_phase_seconds_sum",
                                  "Seconds each worker spent in each step phase (data, compute, "
                                  "reduce, copy, push, wait, pull), from its heartbeats",
                                  *registry)),
        phase_count_(RegisterFamily(prometheus::BuildGauge(), "ps_worker_phase_seconds_count",
                                    "Times each worker went through each step phase",
                                    *registry)),
        faults_total_(RegisterFamily(prometheus::BuildCounter(), "ps_server_minor_faults_total",
                                     "Minor page faults of the server process (fresh pages "
                                     "touched; ps_server_job{what=\"minor_faults_per_step\"} "
                                     "is their rate per version)",
                                     *registry)
                          .Add({})) {
    prometheus::Histogram* staleness =
        &RegisterFamily(prometheus::BuildHistogram(), "ps_server_push_staleness",
                        "Asynchronous consistency: updates a push's chunks had received since "
                        "the version it was computed from; ssp:S: iterations before the pushed "
                        "one whose updates its parameters lacked",
                        *registry)
             .Add({}, StalenessBuckets());
    service_options->on_staleness = [staleness](int64_t s) {
      staleness->Observe(static_cast<double>(s));
    };
    service_options->on_answer = [rpcs = &rpcs_](absl::string_view method,
                                                 absl::StatusCode code) {
      rpcs->Add({{"method", std::string(method)}, {"code", absl::StatusCodeToString(code)}})
          .Increment();
    };
  }

  void Update(const ParameterServer::Progress& progress, int64_t now_ns,
              absl::Duration liveness_timeout, const ParameterServerService& service,
              const Checkpointer* checkpointer) {
    int registered = 0, live = 0;
    for (const ParameterServer::WorkerProgress& w : progress.workers) {
      if (w.id.empty()) continue;
      ++registered;
      live += w.heard_ns >= 0 && now_ns - w.heard_ns <= absl::ToInt64Nanoseconds(liveness_timeout);
    }
    job_.Add({{"what", "version"}}).Set(static_cast<double>(progress.version));
    job_.Add({{"what", "registered_workers"}}).Set(registered);
    job_.Add({{"what", "live_workers"}}).Set(live);
    job_.Add({{"what", "waiting_pulls"}}).Set(static_cast<double>(service.waiting_pulls()));
    UpdateFaults(progress.version);
    if (checkpointer != nullptr) {
      job_.Add({{"what", "checkpoint_age_seconds"}})
          .Set(absl::ToDoubleSeconds(checkpointer->time_since_last_write()));
    }
    for (const auto& [rank, report] : service.worker_reports()) {
      const std::string r = std::to_string(rank);
      workers_.Add({{"rank", r}, {"what", "steps"}}).Set(static_cast<double>(report.steps()));
      for (const proto::PhaseTotal& phase : report.phases()) {
        phase_sum_.Add({{"rank", r}, {"phase", phase.phase()}}).Set(phase.seconds());
        phase_count_.Add({{"rank", r}, {"phase", phase.phase()}})
            .Set(static_cast<double>(phase.count()));
      }
    }
  }

 private:
  prometheus::Family<prometheus::Counter>& rpcs_;
  prometheus::Family<prometheus::Gauge>& job_;
  prometheus::Family<prometheus::Gauge>& workers_;
  prometheus::Family<prometheus::Gauge>& phase_sum_;
  prometheus::Family<prometheus::Gauge>& phase_count_;
  prometheus::Counter& faults_total_;
  // The process's faults and the version at the last update that saw the
  // version move; -1 before the first.
  int64_t last_faults_ = -1, last_version_ = -1;

  // The process's faults into the counter, and per version over the last
  // interval in which the version moved: in steady state (received bytes
  // landing in reused memory) near 0, about one per 4 KiB received where
  // each step's bytes land in fresh pages.
  void UpdateFaults(int64_t version) {
    const int64_t now = ProcessMinorFaults();
    if (now < 0 || version == last_version_) return;
    faults_total_.Increment(static_cast<double>(now - std::max<int64_t>(last_faults_, 0)));
    if (last_faults_ >= 0 && version > last_version_) {
      job_.Add({{"what", "minor_faults_per_step"}})
          .Set(static_cast<double>(now - last_faults_) /
               static_cast<double>(version - last_version_));
    }
    last_faults_ = now;
    last_version_ = version;
  }
};

// The trace and the metrics endpoint the options ask for, as the
// parameter server's observers.
struct Observers {
  std::unique_ptr<ChromeTraceObserver> trace;
  std::unique_ptr<MetricsServer> metrics;
  std::unique_ptr<EventMetrics> event_metrics;
  ObserverFanOut fan_out;
};

absl::Status StartObservers(const ServerOptions& options, Observers* observers) {
  if (!options.trace.empty()) {
    ChromeTraceOptions trace_options;
    trace_options.pid = kServerTracePid;
    trace_options.process_name = "server";
    trace_options.max_events = options.trace_max_events;
    observers->trace = std::make_unique<ChromeTraceObserver>(trace_options);
    observers->fan_out.Add(observers->trace.get());
  }
  if (options.metrics_port >= 0) {
    PS_ASSIGN_OR_RETURN(observers->metrics,
                        MetricsServer::Start(absl::StrCat(options.metrics_address, ":",
                                                          options.metrics_port)));
    observers->event_metrics =
        std::make_unique<EventMetrics>(observers->metrics->registry(), "ps_server");
    observers->fan_out.Add(observers->event_metrics.get());
    std::printf("metrics at http://%s:%d/metrics\n", options.metrics_address.c_str(),
                observers->metrics->port());
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

// The service listening as the options say: TLS or plaintext (refused off
// loopback unless insecure), bounded memory and streams.
struct Listening {
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

absl::StatusOr<Listening> Listen(const ServerOptions& options, ParameterServerService* service) {
  PS_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                      MakeServerCredentials(options.tls));
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  Listening listening;
  builder.AddListeningPort(HostPort(options.bind_address, options.port), credentials,
                           &listening.port);
  builder.RegisterService(service);
  // Bounds a hostile or broken client cannot grow past: gRPC's buffers for
  // calls in flight, and the calls one connection may have open.
  grpc::ResourceQuota quota("ps-server");
  quota.Resize(static_cast<size_t>(options.grpc_memory_limit_mb) << 20);
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.max_concurrent_streams);
  listening.server = builder.BuildAndStart();
  if (listening.server == nullptr || listening.port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.bind_address, ":", options.port));
  }
  listening.server->GetHealthCheckService()->SetServingStatus(true);
  return listening;
}

// Launchers wait for this file: written last, once everything serves.
absl::Status WritePortFile(const std::string& path, int port) {
  if (path.empty()) return absl::OkStatus();
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return absl::UnavailableError("cannot write --port_file");
  std::fprintf(f, "%d\n", port);
  std::fclose(f);
  return absl::OkStatus();
}

// The start line (who, where, how secure, from what), and warnings about
// what a non-loopback address leaves open.
void Announce(const ServerOptions& options, int port, const std::string& initial_from) {
  const std::string advertised = options.advertise_address.empty()
                                     ? HostPort(options.bind_address, port)
                                     : options.advertise_address;
  const bool loopback = IsLoopback(options.bind_address);
  const std::string security =
      UsesTls(options.tls)
          ? (options.tls.client_ca_file.empty() ? "TLS" : "mutual TLS")
          : (loopback ? "plaintext (loopback)" : "INSECURE plaintext (--insecure)");
  const bool sum_only = options.job.optimizer.kind == kMeanGradientOptimizer;
  std::printf("parameter server for %d workers (%s%s) at %s, %s%s, initial parameters from %s\n",
              options.job.num_workers, options.job.consistency->Name().c_str(),
              sum_only ? ", sum-only: publishes mean gradients (--optimizer=none)" : "",
              advertised.c_str(), security.c_str(),
              options.job_token.empty() ? "" : ", job token required", initial_from.c_str());
  if (!loopback) {
    if (UsesTls(options.tls) && options.tls.client_ca_file.empty() && options.job_token.empty()) {
      Log("warning: TLS without --tls_client_ca or a job token: anyone who reaches the port "
          "can register as a worker and pull the model");
    }
    if (!UsesTls(options.tls) && !options.job_token.empty()) {
      Log("warning: the job token crosses the network in plaintext (--insecure)");
    }
  }
  std::fflush(stdout);
}

std::unique_ptr<Checkpointer> StartCheckpointer(const ServerOptions& options,
                                                const std::map<std::string, std::string>& job,
                                                ParameterServer* server,
                                                int64_t resumed_version, JobRun* job_run) {
  if (options.checkpoint_dir.empty()) return nullptr;
  CheckpointerOptions checkpoints;
  checkpoints.files.directory = options.checkpoint_dir;
  checkpoints.files.keep = options.checkpoint_keep;
  checkpoints.every_steps = options.checkpoint_every_steps;
  checkpoints.every = options.checkpoint_every;
  checkpoints.job = job;
  checkpoints.log = Log;
  checkpoints.job_run = [job_run] { return job_run->id(); };
  return std::make_unique<Checkpointer>(server, checkpoints, resumed_version);
}

// Stops in order: 1. a final checkpoint at the next version boundary (the
// workers go on until the iteration in progress ends, bounded by
// stop_timeout); 2. every call refused UNAVAILABLE "shutting down", which
// workers take as a reason to reconnect; the waiting pulls answered, and
// gRPC stopped within 2 s whatever the clients do; 3. the trace written,
// once no call is in flight.
absl::Status Shutdown(const ServerOptions& options, const std::string& reason,
                      ParameterServer* server, Checkpointer* checkpointer,
                      ParameterServerService* service, grpc::Server* grpc_server,
                      ChromeTraceObserver* trace) {
  std::printf("parameter server stopping at version %lld (%s)\n",
              static_cast<long long>(server->version()), reason.c_str());
  std::fflush(stdout);
  if (checkpointer != nullptr) {
    const absl::Status final_checkpoint =
        checkpointer->WriteFinal(options.stop_timeout);
    if (!final_checkpoint.ok()) {
      Log(absl::StrCat("no final checkpoint (the newest is of version ",
                       checkpointer->last_version(), "): ", final_checkpoint.message()));
    }
  }
  service->StopServing(reason);
  service->Shutdown();
  grpc_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (trace != nullptr) {
    PS_RETURN_IF_ERROR(trace->WriteTo(options.trace));
    std::printf("wrote the timeline (%lld events, %lld dropped) to %s\n",
                static_cast<long long>(trace->size()), static_cast<long long>(trace->dropped()),
                options.trace.c_str());
  }
  return absl::OkStatus();
}

// Whether this server can go back to its checkpoint of `version` (a
// Restore): the checkpointer stopped first, so that a write of `version`
// under way has finished, then the checkpoint checked whole. When it
// cannot, FAILED_PRECONDITION naming the version, why, and the versions
// there are, and *checkpointer restarted where it was.
absl::Status DecideRestore(const ServerOptions& options,
                           const std::map<std::string, std::string>& job, int64_t version,
                           ParameterServer* server, JobRun* job_run,
                           std::unique_ptr<Checkpointer>* checkpointer) {
  const int64_t last = (*checkpointer)->last_version();
  (*checkpointer)->Stop();
  absl::StatusOr<LoadedCheckpoint> loaded =
      LoadCheckpointOfVersion(options.checkpoint_dir, version);
  absl::Status refused;
  if (!loaded.ok()) {
    absl::StatusOr<std::vector<int64_t>> versions = ListCheckpointVersions(options.checkpoint_dir);
    refused = absl::FailedPreconditionError(absl::StrCat(
        "no valid checkpoint of version ", version, " to restore (", loaded.status().message(),
        "); this server is at version ", server->version(), " and has checkpoints of versions ",
        versions.ok() ? (versions->empty() ? "none" : absl::StrJoin(*versions, ", "))
                      : std::string(versions.status().message())));
  } else if (auto run = loaded->contents.job.find(kJobRunSetting);
             run != loaded->contents.job.end() && !job_run->id().empty() &&
             run->second != job_run->id()) {
    refused = absl::FailedPreconditionError(absl::StrCat(
        loaded->manifest_path, " is of job run ", run->second, ", this server's is ",
        job_run->id()));
  }
  if (!refused.ok()) {
    *checkpointer = StartCheckpointer(options, job, server, last, job_run);
  }
  return refused;
}

// What the gRPC service needs of the options: supervision, pacing, the
// token, the job run and (with checkpoints) restores, answered by `control`.
ServiceOptions MakeServiceOptions(const ServerOptions& options, JobRun* job_run,
                                  ServingControl* control) {
  ServiceOptions service_options;
  service_options.shrinks = options.worker_loss->Shrinks();
  service_options.stall_report_after = options.stall_report_every;
  service_options.liveness_timeout = options.liveness_timeout;
  service_options.client_certificates = !options.tls.client_ca_file.empty();
  service_options.max_push_lead_bytes = options.max_push_lead_bytes;
  service_options.push_lead_idle = options.push_lead_idle;
  service_options.push_hold_limit = options.push_hold_limit;
  service_options.job_token = options.job_token;
  service_options.job_run = job_run;
  if (!options.checkpoint_dir.empty()) {
    service_options.restore = [control](int64_t version, ServingControl::Done done) {
      control->AskRestore(version, std::move(done));
    };
  }
  return service_options;
}

// The end of a generation for a restore of `version`: no final checkpoint
// (the state past `version` is thrown away); every call refused, the
// sessions gone with this generation's server, and the newer checkpoints
// out of the resume scan.
absl::Status EndGenerationForRestore(const ServerOptions& options, int64_t version,
                                     ParameterServer* server, ServingControl* control,
                                     std::unique_ptr<Checkpointer> checkpointer,
                                     ParameterServerService* service, Listening listening) {
  const std::string reason = absl::StrCat("restoring its checkpoint of version ", version);
  std::printf("parameter server at version %lld %s (asked by a worker)\n",
              static_cast<long long>(server->version()), reason.c_str());
  std::fflush(stdout);
  control->Close();
  checkpointer.reset();
  service->StopServing(reason);
  service->Shutdown();
  listening.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  listening.server.reset();
  return SetAsideCheckpointsAfter(options.checkpoint_dir, version);
}

}  // namespace

absl::Status RunServer(const ServerOptions& options, StopRequest* stop) {
  if (!UsesTls(options.tls) && !IsLoopback(options.bind_address) && !options.insecure) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing to serve plaintext on ", options.bind_address,
        ": give --tls_cert/--tls_key (and --tls_client_ca for mutual TLS), or --insecure on a "
        "network you trust"));
  }
  CpuDevice device(0, std::max(1, options.threads));
  Observers observers;
  PS_RETURN_IF_ERROR(StartObservers(options, &observers));
  ParameterServerOptions job_options = options.job;
  job_options.observer = observers.fan_out.empty() ? nullptr : &observers.fan_out;
  const std::map<std::string, std::string> job = JobSettings(job_options);

  // A stop or a restore ends a serving generation; the stop forwarded here
  // until this returns.
  ServingControl control;
  stop->OnRequest([&control](const std::string& reason) { control.Stop(reason); });
  struct Unhook {
    StopRequest* stop;
    ~Unhook() { stop->OnRequest(nullptr); }
  } unhook{stop};
  JobRun job_run;
  ServiceOptions service_options = MakeServiceOptions(options, &job_run, &control);
  std::unique_ptr<JobMetrics> job_metrics;
  if (observers.metrics != nullptr) {
    job_metrics = std::make_unique<JobMetrics>(&observers.metrics->registry(), &service_options);
  }

  // Probes that cannot speak the job port's TLS ask this one; it says
  // "serving" while a generation serves.
  std::unique_ptr<HealthListener> health;
  if (options.health_port >= 0) {
    PS_ASSIGN_OR_RETURN(health, HealthListener::Start(
                                    HostPort(options.bind_address, options.health_port)));
    std::printf("health checks (plaintext, nothing else) at %s:%d\n",
                options.bind_address.c_str(), health->port());
  }
  // Each generation listens on the port the first one got.
  ServerOptions generation_options = options;
  for (bool first = true;; first = false) {
    PS_ASSIGN_OR_RETURN(StartedServer started,
                        CreateOrResume(job_options, options.checkpoint_dir, options.init_weights,
                                       job, &device));
    ParameterServer* const server = started.server.get();
    job_run.Reset(started.job_run);
    ParameterServerService service(server, service_options);
    PS_ASSIGN_OR_RETURN(Listening listening, Listen(generation_options, &service));
    generation_options.port = listening.port;
    Announce(options, listening.port, started.initial_from);
    std::unique_ptr<Checkpointer> checkpointer =
        StartCheckpointer(options, job, server, started.resumed_version, &job_run);
    if (first) PS_RETURN_IF_ERROR(WritePortFile(options.port_file, listening.port));
    control.Reopen();
    if (health != nullptr) health->SetServing(true);

    // The supervisor looks at the job once a second until the generation
    // ends; a job it fails stops the server as a signal would.
    JobSupervisorOptions supervision;
    supervision.stall_report_every = options.stall_report_every;
    supervision.liveness_timeout = options.liveness_timeout;
    supervision.policy = options.worker_loss.get();
    supervision.log = Log;
    SupervisedJob supervised;
    supervised.progress = [server] { return server->progress(); };
    supervised.drop = [&service](int rank) { return service.DropWorker(rank); };
    supervised.fail = [&service, stop](const absl::Status& failure) {
      service.FailJob(failure);
      stop->Request("the job failed");
    };
    JobSupervisor supervisor(supervision, supervised);
    absl::Notification stopped;
    std::thread ticker([&] {
      while (!stopped.WaitForNotificationWithTimeout(absl::Seconds(1))) {
        if (job_metrics != nullptr) {
          job_metrics->Update(server->progress(), supervision.clock->NowNanos(),
                              options.liveness_timeout, service, checkpointer.get());
        }
        if (!supervisor.Tick()) return;
      }
    });
    // Restores are decided one at a time; a refused one leaves the
    // generation serving.
    ServingControl::Event event;
    for (;;) {
      event = control.Wait();
      if (event.stop.has_value()) break;
      const absl::Status decided = event.restore == server->version()
                                       ? absl::OkStatus()
                                       : DecideRestore(options, job, event.restore, server,
                                                       &job_run, &checkpointer);
      control.Answer(event.restore, decided);
      if (decided.ok() && event.restore != server->version()) break;
      if (!decided.ok()) Log(absl::StrCat("restore refused: ", decided.message()));
    }
    stopped.Notify();
    ticker.join();
    if (health != nullptr) health->SetServing(false);
    if (event.stop.has_value()) {
      PS_RETURN_IF_ERROR(Shutdown(options, *event.stop, server, checkpointer.get(), &service,
                                  listening.server.get(), observers.trace.get()));
      if (supervisor.failed()) {
        return absl::FailedPreconditionError("the job failed: a worker was lost");
      }
      return absl::OkStatus();
    }
    PS_RETURN_IF_ERROR(EndGenerationForRestore(options, event.restore, server, &control,
                                               std::move(checkpointer), &service,
                                               std::move(listening)));
  }
}

}  // namespace ps::server
