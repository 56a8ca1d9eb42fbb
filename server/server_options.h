#ifndef PS_SERVER_SERVER_OPTIONS_H_
#define PS_SERVER_SERVER_OPTIONS_H_

// Everything the parameter-server daemon is told, typed: RunServer's input.
// server_flags.h builds it from the command line; tests and embedders fill
// it in directly. Validation of values that need the file system or the
// network (TLS files, the port) happens in RunServer.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "common/tls_credentials.h"
#include "server/parameter_server.h"
#include "server/worker_loss/worker_loss_policy.h"

namespace ps::server {

struct ServerOptions {
  // The job: workers, consistency, optimizer, loss scaling, chunking. Its
  // observer is RunServer's (trace and metrics), not the caller's.
  ParameterServerOptions job;
  // CPU threads for the optimizer.
  int threads = 1;
  // A safetensors file with the initial parameters, matched to the workers'
  // model by name (empty: worker rank 0 sends its own).
  std::string init_weights;

  // Where it listens and what it tells workers.
  std::string bind_address = "127.0.0.1";
  int port = 50051;                // 0: pick a free one
  std::string advertise_address;   // empty: bind_address:port
  std::string port_file;           // written with the bound port once serving
  // gRPC's memory for calls in flight, in MiB, and calls per connection.
  int64_t grpc_memory_limit_mb = 4096;
  int max_concurrent_streams = 1000;

  // Checkpoints (empty directory: none) and the final one on a stop.
  std::string checkpoint_dir;
  int64_t checkpoint_every_steps = 100;
  absl::Duration checkpoint_every = absl::ZeroDuration();
  int checkpoint_keep = 3;
  absl::Duration stop_timeout = absl::Seconds(10);

  // Supervision: liveness, stall reports and the worker-loss policy.
  absl::Duration liveness_timeout = absl::Seconds(10);
  absl::Duration stall_report_every = absl::Seconds(5);
  std::shared_ptr<const WorkerLossPolicy> worker_loss = WaitForLostWorkers(absl::Minutes(10));

  // Pacing of push replies under sync (0 bytes: off).
  int64_t max_push_lead_bytes = 0;
  absl::Duration push_lead_idle = absl::Milliseconds(20);
  absl::Duration push_hold_limit = absl::Seconds(1);

  // Security: TLS files, the job's token (the value, not a path), and
  // whether plaintext off loopback is allowed.
  ServerTlsOptions tls;
  std::string job_token;
  bool insecure = false;

  // Observability: Prometheus metrics (-1: none; 0: any free port) and a
  // Chrome trace written on stop (empty: none).
  int metrics_port = -1;
  // Also serve gRPC's health check alone, in plaintext, on this port of
  // bind_address (0: any free one; -1: not), for probes that cannot speak
  // the job port's TLS (the kubelet's gRPC probes).
  int health_port = -1;
  std::string metrics_address = "127.0.0.1";
  std::string trace;
  int64_t trace_max_events = 1000000;
};

}  // namespace ps::server

#endif  // PS_SERVER_SERVER_OPTIONS_H_
