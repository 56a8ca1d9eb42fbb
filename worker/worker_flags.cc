#include "worker/worker_flags.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/int_list.h"
#include "common/job_token.h"
#include "common/optimizer/optimizer_flags.h"
#include "common/precision.h"
#include "common/status_macros.h"
#include "worker/identity_file.h"
#include "worker/server_store.h"

ABSL_FLAG(std::string, model, "lenet",
          "softmax, mlp, lenet, lenet_relu, resnet18, resnet18_cifar, or profile (with "
          "--model_profile)");
ABSL_FLAG(std::string, model_profile, "",
          "with --model=profile: a model profile (deploy/experiments/profiles/*.json) replayed: "
          "its tensors are the parameters, its per-layer times the compute, scaled by this "
          "worker's batch / the profile's batch_size (docs/experiments.md)");
ABSL_FLAG(std::string, write_model_profile, "",
          "measure the model's per-layer forward/backward times (2 warm-up and 5 timed passes "
          "of --batch_size zero samples on the first CPU device), write them as a model profile "
          "here, and exit without training");
ABSL_FLAG(std::string, mlp_hidden, "256", "mlp hidden widths, comma-separated");
ABSL_FLAG(int64_t, linear_block_rows, 0,
          "mlp/softmax on CPU: a linear layer of at least twice this many outputs computes in "
          "blocks of this many, and under overlap waits for and pushes its parameters block by "
          "block (for a network-bound job, with --stage_early_pulls; 512 for MLP-20M behind "
          "1 Gbit/s); 0: whole layers. Give every worker of a job the same value");
ABSL_FLAG(std::string, dataset, "fashion_mnist", "fashion_mnist, mnist, cifar10 or synthetic");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist", "dataset directory");
ABSL_FLAG(int64_t, batch_size, 256, "global minibatch size (all workers and devices)");
ABSL_FLAG(int64_t, epochs, 10, "epochs to train");
ABSL_FLAG(int64_t, max_steps, 0, "stop after this many steps in all (0: no limit)");
ABSL_FLAG(uint64_t, seed, 0, "seed of the initialisation and the data order");
ABSL_FLAG(bool, shuffle, true, "shuffle the training data each epoch (--noshuffle: fixed order)");
ABSL_FLAG(bool, normalize, false,
          "standardise inputs per channel with the training set's mean/std (default: pixel/255 only)");
ABSL_FLAG(std::string, init_weights, "", "safetensors file to start from");
ABSL_FLAG(std::string, save_weights, "", "safetensors file to write at the end");
ABSL_FLAG(std::string, report, "", "write a JSON report here at the end");
ABSL_FLAG(std::string, devices, "auto", "auto, cpu, cpu:N, cuda, or cuda:ID[,ID...]");
ABSL_FLAG(int, threads, 0, "CPU threads for compute, split between CPU devices (0: all cores)");
ABSL_FLAG(std::string, server, "",
          "parameter server host:port, or its shards' host:port,host:port,... (the same list, "
          "in the same order, on every worker); empty trains alone with SGD in process");
ABSL_FLAG(std::string, worker_id, "", "stable worker id (default hostname-pid)");
ABSL_FLAG(int, rank, -1, "the rank (data part) to ask the server for; -1: any free one");
ABSL_FLAG(bool, evaluate, true, "evaluate on the test set after each epoch");
ABSL_FLAG(bool, progress, true, "show a live progress bar when stderr is a terminal");
ABSL_FLAG(bool, overlap, true,
          "push each layer's gradients as backward produces them and let the next forward wait "
          "only for each layer's new parameters (CPU devices, one or several, or one CUDA device, "
          "whose copies to and from the host then go region by region; several CUDA devices push "
          "and pull bucket by bucket after backward); --nooverlap: the same after the whole "
          "backward, so compute and communication take turns. Bit-identical results either way");
ABSL_FLAG(int64_t, bucket_bytes, ps::worker::PushPullOptions().bucket_bytes,
          "consecutive messages grouped into push/pull buckets of at least this many bytes (0: "
          "one bucket per message); DDP buckets 25 MB, BytePS partitions 4 MB");
ABSL_FLAG(int64_t, max_bytes_in_flight, ps::worker::PushPullOptions().max_bytes_in_flight,
          "bound on the bytes of pushes, and separately of pulls, in flight to each shard; front "
          "layers go first (0: no bound)");
ABSL_FLAG(bool, stage_early_pulls, false,
          "with a server: pull a layer's new parameters while it still computes its input "
          "gradient, into a staging buffer copied in when it is done (one model's memory and a "
          "copy), instead of only after; the pull direction then starts with the pushes (pays "
          "with --linear_block_rows behind a slow link)");
ABSL_FLAG(std::string, compute, "real",
          "real, or replay: time a few real forward/backward passes first (start the other "
          "workers after this one says it has, to measure it alone), then sleep through that "
          "pass each step, layer by layer, pushing and pulling real gradients (experiments "
          "with more emulated hosts than cores)");
ABSL_FLAG(int64_t, replay_calibration_steps, 5, "passes --compute=replay times");
ABSL_FLAG(double, replay_step_ms, 0,
          "with --compute=replay: scale the measured pass to take this many milliseconds (0: as "
          "measured), so runs compare at one compute time whatever else loads the machine");
ABSL_FLAG(double, slowdown, 1,
          "emulate a host this many times slower at compute, for experiments: after each "
          "step's forward/backward (or its replay) sleep (slowdown - 1) x its time (2: half "
          "the speed; 1: none)");
ABSL_FLAG(int64_t, slowdown_period, 0,
          "with --slowdown: 0 slows every step; P > 0 only alternate blocks of P steps, rank r's "
          "offset by r (two workers so slowed take turns being the straggler)");
ABSL_FLAG(int, connections, ps::worker::RemoteStoreOptions().connections,
          "TCP connections to each server shard for pushes, and as many for pulls (more can "
          "fill a fast link one stream cannot)");
ABSL_FLAG(bool, shared_memory, false,
          "on a server's host: move pushed and pulled tensor bytes through memory shared with "
          "it (a sealed memfd the server maps; one memcpy each side) instead of loopback TCP; "
          "falls back to TCP, saying why, where the server cannot map it (another host, "
          "container or user). Dense fp32 only (--compression=none)");
ABSL_FLAG(double, validation_fraction, 0,
          "hold out this fraction of the training set (seeded by --seed, the same on every "
          "worker, never trained on) and evaluate on it after each epoch");
ABSL_FLAG(std::string, plot, "",
          "draw the per-epoch curves (train loss, train/validation/test accuracy) as a PNG here, "
          "updated after each epoch (Debian's python3-matplotlib)");
ABSL_FLAG(bool, check, false,
          "check each --server address as this worker would connect (name, TCP, TLS, job token, "
          "model, round trip, pull speed), print what to fix, and exit: 0 when all pass");
ABSL_FLAG(std::string, compression, "none",
          "how gradients and parameters travel: none (fp32), fp16 or bf16 (half the bytes each "
          "way; the server keeps fp32 master weights), topk:F (pushes only the largest F of each "
          "chunk, with error feedback; pulls fp32)");
ABSL_FLAG(std::string, precision, "fp32",
          "precision of the devices' matrix multiplies (linear layers, convolutions): fp32, "
          "bf16 or fp16 operands with fp32 accumulation; activations, gradients, the loss "
          "and the server's master weights stay fp32");
ABSL_FLAG(bool, recover, true,
          "when the server goes away or restarts, reconnect and resume from its version "
          "(a checkpoint's) instead of failing");
ABSL_FLAG(absl::Duration, connect_timeout, absl::Seconds(60),
          "how long to keep trying to register with the server at the start (it may come up "
          "after the worker; each failed try is logged with its reason)");
ABSL_FLAG(absl::Duration, reconnect_timeout, absl::Minutes(5),
          "how long to wait for a lost server to come back (SIGTERM ends the wait)");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA that signed the server's certificate: connect with TLS (default plaintext)");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate for mutual TLS (with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_server_name, "",
          "name the server's certificate carries, when it is not the host in --server");
ABSL_FLAG(std::string, job_token_file, "",
          "file holding the job's shared token (default: $PS_JOB_TOKEN; never a flag value, "
          "which `ps` would show)");
ABSL_FLAG(std::string, identity_file, "",
          "file holding this worker's identity secret, made (mode 0600) at the first start: "
          "restarted with it, the worker takes back at once the rank its --worker_id holds; "
          "without it (and without a certificate naming the id under mutual TLS) it waits until "
          "the server declares its previous process lost (--liveness_timeout)");
ABSL_FLAG(int, metrics_port, -1,
          "serve this worker's Prometheus metrics at http://--metrics_address:PORT/metrics (0: any "
          "free port, printed; -1: none)");
ABSL_FLAG(std::string, metrics_address, "127.0.0.1", "address the metrics endpoint binds");
ABSL_FLAG(std::string, trace, "",
          "write a Chrome trace-event timeline (Perfetto, chrome://tracing) here at the end");
ABSL_FLAG(int64_t, trace_max_events, 1000000,
          "events --trace keeps; later ones are dropped and counted in the file");

namespace ps::worker {
namespace {

// --devices, --threads and the model's flags.
absl::Status DevicesAndModelFromFlags(WorkerOptions& options) {
  absl::StatusOr<DeviceSpec> devices = ParseDeviceSpec(absl::GetFlag(FLAGS_devices));
  if (!devices.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--devices: ", devices.status().message()));
  }
  options.devices = *devices;
  options.threads = absl::GetFlag(FLAGS_threads);
  options.model.name = absl::GetFlag(FLAGS_model);
  PS_ASSIGN_OR_RETURN(options.model.mlp_hidden,
                      ParsePositiveIntList("--mlp_hidden", absl::GetFlag(FLAGS_mlp_hidden)));
  options.model_profile = absl::GetFlag(FLAGS_model_profile);
  options.write_model_profile = absl::GetFlag(FLAGS_write_model_profile);
  if ((options.model.name == "profile") != !options.model_profile.empty()) {
    return absl::InvalidArgumentError(
        "--model=profile and --model_profile=FILE go together (the profile is the model)");
  }
  if (!options.model_profile.empty() && !options.write_model_profile.empty()) {
    return absl::InvalidArgumentError(
        "--write_model_profile measures a built-in model, not a replayed profile");
  }
  options.model.linear_block_rows = absl::GetFlag(FLAGS_linear_block_rows);
  if (options.model.linear_block_rows < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--linear_block_rows is ", options.model.linear_block_rows, "; 0 or more"));
  }
  return absl::OkStatus();
}

// The optimizer and loss scaling in this process. A parameter-server job
// has one optimizer, the server's, so its flags here would be ignored: they
// are refused.
absl::Status OptimizerFromFlags(int argc, char** argv, WorkerOptions& options) {
  if (!options.servers.empty()) {
    const std::vector<std::string> given = OptimizerFlagsOnCommandLine(argc, argv);
    if (!given.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          absl::StrJoin(given, ", "), given.size() == 1 ? " is" : " are",
          " the server's with --server: the parameter server owns the optimizer, so pass ",
          absl::StrJoin(given, ", "), " to the server (bazel-bin/server/server ", given[0],
          "=...) and not to the worker"));
    }
  }
  PS_ASSIGN_OR_RETURN(options.optimizer, OptimizerOptionsFromFlags());
  PS_ASSIGN_OR_RETURN(options.loss_scale, LossScaleOptionsFromFlags());
  return absl::OkStatus();
}

// The trainer's flags: batches, epochs, data order, precision, the
// push/pull pipeline, compute replay and slowdown, recovery.
absl::Status TrainerFromFlags(TrainerOptions& trainer) {
  trainer.batch_size = absl::GetFlag(FLAGS_batch_size);
  trainer.epochs = absl::GetFlag(FLAGS_epochs);
  trainer.max_steps = absl::GetFlag(FLAGS_max_steps);
  trainer.overlap = absl::GetFlag(FLAGS_overlap);
  absl::StatusOr<Precision> precision = ParsePrecision(absl::GetFlag(FLAGS_precision));
  if (!precision.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--precision: ", precision.status().message()));
  }
  trainer.precision = *precision;
  const std::string compute = absl::GetFlag(FLAGS_compute);
  if (compute != "real" && compute != "replay") {
    return absl::InvalidArgumentError(
        absl::StrCat("--compute must be real or replay, got '", compute, "'"));
  }
  trainer.replay_compute = compute == "replay";
  trainer.replay_calibration_steps = absl::GetFlag(FLAGS_replay_calibration_steps);
  trainer.replay_step_seconds = absl::GetFlag(FLAGS_replay_step_ms) / 1e3;
  trainer.slowdown = absl::GetFlag(FLAGS_slowdown);
  trainer.slowdown_period = absl::GetFlag(FLAGS_slowdown_period);
  trainer.push_pull.bucket_bytes = absl::GetFlag(FLAGS_bucket_bytes);
  trainer.push_pull.max_bytes_in_flight = absl::GetFlag(FLAGS_max_bytes_in_flight);
  trainer.push_pull.stage_early_pulls = absl::GetFlag(FLAGS_stage_early_pulls);
  trainer.seed = absl::GetFlag(FLAGS_seed);
  trainer.shuffle = absl::GetFlag(FLAGS_shuffle);
  trainer.init_weights = absl::GetFlag(FLAGS_init_weights);
  trainer.evaluate = absl::GetFlag(FLAGS_evaluate);
  trainer.recover_from_server_loss = absl::GetFlag(FLAGS_recover);
  if (trainer.batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--batch_size must be >= 1, got ", trainer.batch_size));
  }
  return absl::OkStatus();
}

// How this worker reaches its servers: TLS and the job token are read only
// when there are some (an address list of only commas and spaces has none).
absl::Status ServersFromFlags(WorkerOptions& options) {
  RemoteStoreOptions& remote = options.remote;
  remote.worker_id = absl::GetFlag(FLAGS_worker_id);
  remote.rank = absl::GetFlag(FLAGS_rank);
  remote.connections = absl::GetFlag(FLAGS_connections);
  remote.compression = absl::GetFlag(FLAGS_compression);
  remote.shared_memory = absl::GetFlag(FLAGS_shared_memory);
  remote.connect_timeout = absl::GetFlag(FLAGS_connect_timeout);
  remote.reconnect_timeout = absl::GetFlag(FLAGS_reconnect_timeout);
  for (const auto& [flag, timeout] : {std::pair{"--connect_timeout", remote.connect_timeout},
                                      std::pair{"--reconnect_timeout", remote.reconnect_timeout}}) {
    if (timeout <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " is ", absl::FormatDuration(timeout), "; it must be positive"));
    }
  }
  const std::vector<std::string> shards = SplitServerList(options.servers);
  if (!shards.empty()) {
    remote.tls.ca_file = absl::GetFlag(FLAGS_tls_ca);
    remote.tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
    remote.tls.key_file = absl::GetFlag(FLAGS_tls_key);
    remote.tls.server_name_override = absl::GetFlag(FLAGS_tls_server_name);
    PS_ASSIGN_OR_RETURN(remote.job_token, ReadJobToken(absl::GetFlag(FLAGS_job_token_file),
                                                       std::getenv(kJobTokenEnvVar)));
    if (const std::string identity_file = absl::GetFlag(FLAGS_identity_file);
        !identity_file.empty()) {
      PS_ASSIGN_OR_RETURN(remote.identity_proof, LoadOrCreateIdentity(identity_file));
    }
  }
  options.check = absl::GetFlag(FLAGS_check);
  if (options.check && shards.empty()) {
    return absl::InvalidArgumentError("--check needs --server");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<WorkerOptions> WorkerOptionsFromFlags(int argc, char** argv) {
  WorkerOptions options;
  options.servers = absl::GetFlag(FLAGS_server);
  PS_RETURN_IF_ERROR(DevicesAndModelFromFlags(options));
  options.dataset = absl::GetFlag(FLAGS_dataset);
  options.data_dir = absl::GetFlag(FLAGS_data_dir);
  options.validation_fraction = absl::GetFlag(FLAGS_validation_fraction);
  options.normalize = absl::GetFlag(FLAGS_normalize);
  PS_RETURN_IF_ERROR(OptimizerFromFlags(argc, argv, options));
  PS_RETURN_IF_ERROR(TrainerFromFlags(options.trainer));
  PS_RETURN_IF_ERROR(ServersFromFlags(options));

  options.progress = absl::GetFlag(FLAGS_progress);
  options.plot = absl::GetFlag(FLAGS_plot);
  options.save_weights = absl::GetFlag(FLAGS_save_weights);
  options.report = absl::GetFlag(FLAGS_report);
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  options.metrics_address = absl::GetFlag(FLAGS_metrics_address);
  options.trace = absl::GetFlag(FLAGS_trace);
  options.trace_max_events = absl::GetFlag(FLAGS_trace_max_events);
  return options;
}

}  // namespace ps::worker
