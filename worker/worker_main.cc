// The worker daemon. Without --server it trains on its own devices with SGD
// in process; with --server it is one worker of a synchronous
// parameter-server job: it states the model (the server knows none), sends
// the initial parameters when it has rank 0, and leaves the optimizer to the
// server. --server may list several shards (host:port,host:port,...): the
// worker then cuts the model over them (worker/shard_plan.h) and talks to
// every shard concurrently.
//
//   bazel run -c opt //worker:worker -- --model=lenet --epochs=10

#include <sys/resource.h>
#include <unistd.h>

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/chrome_trace.h"
#include "common/clock.h"
#include "common/cpu_device.h"
#include "common/devices.h"
#include "common/int_list.h"
#include "common/job_token.h"
#include "common/metrics.h"
#include "common/optimizer/optimizer_flags.h"
#include "common/process_tuning.h"
#include "common/status_macros.h"
#include "common/wire_codec.h"
#include "kernels/gemm.h"
#include "proto/parameter_server.pb.h"
#include "worker/data/loader.h"
#include "worker/local_parameter_store.h"
#include "worker/remote_parameter_store.h"
#include "worker/server_check.h"
#include "worker/sharded_parameter_store.h"
#include "worker/trainer.h"
#include "worker/training_plot.h"
#include "worker/weights.h"
#include "worker/worker_metrics.h"

ABSL_FLAG(std::string, model, "lenet", "softmax, mlp, lenet, lenet_relu or resnet18");
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
          "only for each layer's new parameters (one CPU device; others push and pull bucket by "
          "bucket after backward); --nooverlap: the same after the whole backward, so compute and "
          "communication take turns. Bit-identical results either way");
ABSL_FLAG(int64_t, bucket_bytes, ps::worker::PushPullOptions().bucket_bytes,
          "consecutive messages grouped into push/pull buckets of at least this many bytes (0: "
          "one bucket per message); DDP buckets 25 MB, BytePS partitions 4 MB");
ABSL_FLAG(int64_t, max_bytes_in_flight, ps::worker::PushPullOptions().max_bytes_in_flight,
          "bound on the bytes of pushes, and separately of pulls, in flight; front layers go "
          "first (0: no bound)");
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

// SIGTERM and SIGINT never run a handler in this process (BlockStopSignals
// says why: our GEMMs are oneDNN's): main() blocks both before any thread
// exists and one thread takes them with sigwait. Until training starts a signal ends the process at once (128 + signal);
// then the first asks the trainer to stop after the step in progress (it
// reads stop_requested after each step) and a second ends it at once.
std::atomic<bool> stop_requested{false};
std::atomic<bool> training_started{false};

void BlockAndTakeStopSignals() {
  const sigset_t stop_signals = BlockStopSignals();
  std::thread([stop_signals] {
    for (;;) {
      int signal_number = 0;
      if (sigwait(&stop_signals, &signal_number) != 0) continue;
      if (training_started && !stop_requested.exchange(true)) continue;
      // What is buffered is written, unless another thread holds the stream
      // (blocked writing to a pipe nobody reads): the exit never waits on it.
      for (FILE* stream : {stdout, stderr}) {
        if (ftrylockfile(stream) != 0) continue;
        fflush_unlocked(stream);
        funlockfile(stream);
      }
      _exit(128 + signal_number);
    }
  }).detach();
}

// The step phases' totals since the start (seconds and count per phase,
// and the steps), which the heartbeats report to the server's metrics.
class PhaseTotals final : public EventObserver {
 public:
  void OnEvent(const TimedEvent& event) override {
    if (event.lane != kTrainerLane || !IsStepPhase(event.kind)) return;
    absl::MutexLock lock(&mu_);
    Total& t = totals_[std::string(EventKindName(event.kind))];
    t.seconds += static_cast<double>(event.end_ns - event.start_ns) / 1e9;
    ++t.count;
    if (event.kind == EventKind::kData) ++steps_;
  }
  void Fill(proto::HeartbeatRequest* request) const {
    absl::MutexLock lock(&mu_);
    request->set_steps(steps_);
    for (const auto& [phase, t] : totals_) {
      proto::PhaseTotal* p = request->add_phases();
      p->set_phase(phase);
      p->set_seconds(t.seconds);
      p->set_count(t.count);
    }
  }

 private:
  struct Total {
    double seconds = 0;
    int64_t count = 0;
  };
  mutable absl::Mutex mu_;
  std::map<std::string, Total> totals_ ABSL_GUARDED_BY(mu_);
  int64_t steps_ ABSL_GUARDED_BY(mu_) = 0;
};

std::string FormatSplit(const TimeSplit& s) {
  const double total = s.data + s.compute + s.reduce + s.copy + s.push + s.wait + s.pull;
  if (total <= 0) return "";
  auto pct = [&](double x) { return 100.0 * x / total; };
  return absl::StrFormat(
      "data %.0f%% compute %.0f%% reduce %.0f%% copy %.0f%% push %.0f%% wait %.0f%% pull %.0f%%",
      pct(s.data), pct(s.compute), pct(s.reduce), pct(s.copy), pct(s.push), pct(s.wait),
      pct(s.pull));
}

// `trace` (null without --trace) receives the trainer's and the remote
// store's events on one clock.
absl::Status Main(int argc, char** argv, ChromeTraceObserver* trace) {
  const Clock* clock = Clock::Real();
  // Devices.
  PS_ASSIGN_OR_RETURN(DeviceSpec spec, ParseDeviceSpec(absl::GetFlag(FLAGS_devices)));
  const int threads = absl::GetFlag(FLAGS_threads) > 0
                          ? absl::GetFlag(FLAGS_threads)
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  PS_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Device>> owned, CreateDevices(spec, threads));
  std::vector<Device*> devices;
  for (auto& d : owned) devices.push_back(d.get());
  // D CPU devices run concurrently: each BLAS call gets its device's share.
  kernels::SetBlasThreads(devices[0]->is_cpu()
                              ? AsCpu(*devices[0]).num_threads()
                              : 1);

  // Data.
  const std::string dataset = absl::GetFlag(FLAGS_dataset);
  PS_ASSIGN_OR_RETURN(data::Dataset train,
                      data::LoadDataset(dataset, absl::GetFlag(FLAGS_data_dir), "train"));
  PS_ASSIGN_OR_RETURN(data::Dataset test,
                      data::LoadDataset(dataset, absl::GetFlag(FLAGS_data_dir), "test"));
  data::Dataset validation;
  if (absl::GetFlag(FLAGS_validation_fraction) != 0) {
    // In place: the training set is never held twice.
    PS_ASSIGN_OR_RETURN(data::HoldoutSplit split,
                        data::SplitHoldout(std::move(train),
                                           absl::GetFlag(FLAGS_validation_fraction),
                                           absl::GetFlag(FLAGS_seed)));
    train = std::move(split.train);
    validation = std::move(split.validation);
  }

  // Model.
  model::ModelConfig model;
  model.name = absl::GetFlag(FLAGS_model);
  model.input_shape = train.sample_shape;
  model.num_classes = train.num_classes;
  PS_ASSIGN_OR_RETURN(model.mlp_hidden, ParsePositiveIntList("--mlp_hidden", absl::GetFlag(FLAGS_mlp_hidden)));
  model.linear_block_rows = absl::GetFlag(FLAGS_linear_block_rows);
  if (model.linear_block_rows < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--linear_block_rows is ",
                                                   model.linear_block_rows, "; 0 or more"));
  }

  // Optimizer: in this process when training alone; a parameter-server job
  // has one optimizer, the server's, so its flags here would be ignored.
  if (!absl::GetFlag(FLAGS_server).empty()) {
    const std::vector<std::string> given = OptimizerFlagsOnCommandLine(argc, argv);
    if (!given.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          absl::StrJoin(given, ", "), given.size() == 1 ? " is" : " are",
          " the server's with --server: the parameter server owns the optimizer, so pass ",
          absl::StrJoin(given, ", "), " to the server (bazel-bin/server/server ",
          given[0], "=...) and not to the worker"));
    }
  }
  PS_ASSIGN_OR_RETURN(OptimizerOptions optimizer, OptimizerOptionsFromFlags());

  // The trainer's events go to the timeline (if any), to the totals the
  // heartbeats report, and to the metrics (--metrics_port, added below).
  PhaseTotals phase_totals;
  ObserverFanOut observers;  // declared before, so destroyed after, the trainer and store
  observers.Add(&phase_totals);
  if (trace != nullptr) observers.Add(trace);
  TrainerOptions options;
  options.observer = &observers;
  options.clock = clock;
  options.batch_size = absl::GetFlag(FLAGS_batch_size);
  options.epochs = absl::GetFlag(FLAGS_epochs);
  options.max_steps = absl::GetFlag(FLAGS_max_steps);
  options.overlap = absl::GetFlag(FLAGS_overlap);
  PS_ASSIGN_OR_RETURN(options.precision, ParsePrecision(absl::GetFlag(FLAGS_precision)));
  const std::string compute = absl::GetFlag(FLAGS_compute);
  if (compute != "real" && compute != "replay") {
    return absl::InvalidArgumentError(
        absl::StrCat("--compute must be real or replay, got '", compute, "'"));
  }
  options.replay_compute = compute == "replay";
  options.replay_calibration_steps = absl::GetFlag(FLAGS_replay_calibration_steps);
  options.replay_step_seconds = absl::GetFlag(FLAGS_replay_step_ms) / 1e3;
  options.slowdown = absl::GetFlag(FLAGS_slowdown);
  options.slowdown_period = absl::GetFlag(FLAGS_slowdown_period);
  options.push_pull.bucket_bytes = absl::GetFlag(FLAGS_bucket_bytes);
  options.push_pull.max_bytes_in_flight = absl::GetFlag(FLAGS_max_bytes_in_flight);
  options.push_pull.stage_early_pulls = absl::GetFlag(FLAGS_stage_early_pulls);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.shuffle = absl::GetFlag(FLAGS_shuffle);
  options.init_weights = absl::GetFlag(FLAGS_init_weights);
  if (absl::GetFlag(FLAGS_normalize)) {
    PS_ASSIGN_OR_RETURN(options.normalization, data::ComputeNormalization(train));
  }
  if (options.batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--batch_size must be >= 1, got ", options.batch_size));
  }
  optimizer.schedule.steps_per_epoch =
      (train.size() + options.batch_size - 1) / options.batch_size;

  // How this worker reaches its servers: their addresses, TLS and the job
  // token, read once for --check and for the store.
  const std::vector<std::string> shards =
      absl::StrSplit(absl::GetFlag(FLAGS_server), ',', absl::SkipWhitespace());
  ClientTlsOptions tls;
  std::string job_token;
  if (!shards.empty()) {
    tls.ca_file = absl::GetFlag(FLAGS_tls_ca);
    tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
    tls.key_file = absl::GetFlag(FLAGS_tls_key);
    tls.server_name_override = absl::GetFlag(FLAGS_tls_server_name);
    PS_ASSIGN_OR_RETURN(job_token, ReadJobToken(absl::GetFlag(FLAGS_job_token_file),
                                                std::getenv(kJobTokenEnvVar)));
  }

  if (absl::GetFlag(FLAGS_check)) {
    if (shards.empty()) return absl::InvalidArgumentError("--check needs --server");
    PS_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> probe, model::Model::Create(model, devices[0]));
    bool all_ok = true;
    for (const std::string& address : shards) {
      ServerCheckOptions check;
      check.address = address;
      check.tls = tls;
      check.job_token = job_token;
      // A shard holds part of the model under its own names: compared with
      // one server only.
      if (shards.size() == 1) {
        check.signature = probe->parameters();
        check.steps_per_epoch = optimizer.schedule.steps_per_epoch;
      }
      const ServerCheckResult result = CheckServer(check);
      std::printf("check %s:\n", address.c_str());
      for (const std::string& line : result.lines) std::printf("  %s\n", line.c_str());
      all_ok &= result.ok;
    }
    std::fflush(stdout);
    if (!all_ok) return absl::FailedPreconditionError("the check failed (see above)");
    std::printf("check: all passed\n");
    return absl::OkStatus();
  }

  // Metrics: the trainer's and the store's timed events, the steps, and the
  // store's calls (through a MeteredParameterStore around it), declared
  // before the store and the trainer, which report to them. The endpoint is
  // never stopped (the process ends with _exit, see main): civetweb's stop
  // waits out its master thread's 2-second poll, 1.8 s at the end of a run.
  MetricsServer* metrics = nullptr;
  std::unique_ptr<WorkerMetrics> worker_metrics;
  ObserverFanOut rpc_observers;  // the store's events: the timeline and the metrics
  if (trace != nullptr) rpc_observers.Add(trace);
  if (absl::GetFlag(FLAGS_metrics_port) >= 0) {
    PS_ASSIGN_OR_RETURN(std::unique_ptr<MetricsServer> started,
                        MetricsServer::Start(absl::StrCat(absl::GetFlag(FLAGS_metrics_address),
                                                          ":", absl::GetFlag(FLAGS_metrics_port))));
    metrics = started.release();
    worker_metrics = std::make_unique<WorkerMetrics>(metrics->registry());
    observers.Add(worker_metrics.get());
    rpc_observers.Add(worker_metrics.get());
    std::printf("metrics at http://%s:%d/metrics\n", absl::GetFlag(FLAGS_metrics_address).c_str(),
                metrics->port());
    std::fflush(stdout);
  }

  // The store: the optimizer in this process, or the parameter server (which
  // then owns the initial parameters and the optimizer settings).
  std::unique_ptr<ParameterStore> store;
  // Tensor bytes over the wire so far, in a server job.
  std::function<int64_t()> bytes_pushed, bytes_pulled;
  std::function<std::map<int64_t, int64_t>()> staleness;  // a server job's, one or sharded
  if (absl::GetFlag(FLAGS_server).empty()) {
    PS_ASSIGN_OR_RETURN(const LossScaleOptions scaling,
                        LossScaleOptionsFromFlags());
    PS_ASSIGN_OR_RETURN(store, LocalParameterStore::Create(optimizer, 1, scaling));
  } else {
    RemoteStoreOptions remote_options;
    remote_options.server_address = absl::GetFlag(FLAGS_server);
    remote_options.worker_id = absl::GetFlag(FLAGS_worker_id);
    remote_options.rank = absl::GetFlag(FLAGS_rank);
    remote_options.steps_per_epoch = optimizer.schedule.steps_per_epoch;
    remote_options.observer = rpc_observers.empty() ? nullptr : &rpc_observers;
    remote_options.report = [&phase_totals](proto::HeartbeatRequest* request) {
      phase_totals.Fill(request);
    };
    remote_options.clock = clock;
    remote_options.connections = absl::GetFlag(FLAGS_connections);
    remote_options.compression = absl::GetFlag(FLAGS_compression);
    remote_options.shared_memory = absl::GetFlag(FLAGS_shared_memory);
    remote_options.reconnect_timeout = absl::GetFlag(FLAGS_reconnect_timeout);
    remote_options.should_stop = [] { return stop_requested.load(); };
    remote_options.log = [](const std::string& line) {
      std::printf("worker: %s\n", line.c_str());
      std::fflush(stdout);
    };
    remote_options.job_token = job_token;
    remote_options.tls = tls;
    // The report's byte counts and staleness, read from either store type.
    auto observe = [&](const auto* r) {
      bytes_pushed = [r] { return r->bytes_pushed(); };
      bytes_pulled = [r] { return r->bytes_pulled(); };
      staleness = [r] { return r->staleness_histogram(); };
    };
    if (shards.size() <= 1) {
      PS_ASSIGN_OR_RETURN(std::unique_ptr<RemoteParameterStore> r,
                          RemoteParameterStore::Create(remote_options));
      observe(r.get());
      store = std::move(r);
    } else {
      ShardedStoreOptions sharded_options;
      sharded_options.shard_addresses = shards;
      sharded_options.remote = remote_options;
      PS_ASSIGN_OR_RETURN(std::unique_ptr<ShardedParameterStore> r,
                          ShardedParameterStore::Create(sharded_options));
      observe(r.get());
      store = std::move(r);
    }
  }
  if (worker_metrics != nullptr) {
    store = std::make_unique<MeteredParameterStore>(std::move(store), worker_metrics.get());
  }
  const bool remote = static_cast<bool>(bytes_pushed);
  options.evaluate = absl::GetFlag(FLAGS_evaluate);
  options.recover_from_server_loss = remote && absl::GetFlag(FLAGS_recover);
  options.should_stop = [] { return stop_requested.load(); };
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                      Trainer::Create(options, model, devices, store.get(), &train, &test,
                                      validation.size() > 0 ? &validation : nullptr));
  // Registered: from here SIGTERM (and SIGINT) end training after the step
  // in progress (see BlockAndTakeStopSignals).
  training_started = true;
  const int rank = trainer->registration().rank;
  if (trace != nullptr) trace->set_process(rank, absl::StrCat("worker ", rank));
  if (options.precision != Precision::kFp32) {
    // What runs in half precision and what does not, said once.
    std::printf("worker %d: precision %s: linear and convolution GEMMs on %s operands with fp32 "
                "accumulation; activations, pooling, batch norm, softmax, loss and gradients "
                "in fp32\n",
                rank, std::string(PrecisionName(options.precision)).c_str(),
                std::string(PrecisionName(options.precision)).c_str());
  }
  if (options.precision == Precision::kFp16 && trainer->registration().loss_scale == 0) {
    // Not an error (small models train), but gradients below fp16's 6e-8
    // vanish and above 65504 overflow without the server's loss scaling.
    std::fprintf(stderr,
                 "worker %d: warning: --precision=fp16 without dynamic loss scaling (start the "
                 "servers with --loss_scale=dynamic, or a worker without --server with it)\n",
                 rank);
  }
  if (const ComputeProfile* profile = trainer->replay_profile(); profile != nullptr) {
    // Launchers wait for this line before starting the next worker.
    std::printf("worker %d: replaying compute: %.3f ms per step, measured over %lld passes\n",
                rank, static_cast<double>(profile->step_ns()) / 1e6,
                static_cast<long long>(profile->passes));
    std::fflush(stdout);
  }

  std::vector<std::string> names;
  for (Device* d : devices) names.push_back(d->name());
  const std::string optimizer_text =
      !remote            ? absl::StrFormat("lr %g", optimizer.sgd.lr)
      : shards.size() > 1 ? absl::StrCat("optimizer on ", shards.size(), " server shards")
                          : std::string("optimizer on the server");
  std::printf("worker %d/%d: training %s (%lld parameters) on %s: %lld train / %lld test "
              "samples, global batch %lld, %s, %lld epochs\n",
              rank, trainer->registration().num_workers, model.name.c_str(), static_cast<long long>(model::TotalElements(trainer->model().parameters())),
              absl::StrJoin(names, ",").c_str(), static_cast<long long>(train.size()),
              static_cast<long long>(test.size()), static_cast<long long>(options.batch_size),
              optimizer_text.c_str(), static_cast<long long>(options.epochs));
  std::fflush(stdout);

  const bool bar = absl::GetFlag(FLAGS_progress) && isatty(STDERR_FILENO);
  if (bar || worker_metrics != nullptr) {
    trainer->set_step_callback([bar, epochs = options.epochs, m = worker_metrics.get(),
                                staleness](const StepProgress& p) {
      if (m != nullptr) {
        m->OnStep(p.epoch, p.step_in_epoch, p.samples);
        if (staleness) m->SetStaleness(staleness());
      }
      if (!bar) return;
      if (p.step_in_epoch % 5 != 0 && p.step_in_epoch != p.steps_in_epoch) return;
      const int width = 30;
      const int filled = static_cast<int>(width * p.step_in_epoch / p.steps_in_epoch);
      // The rest of the run at this epoch's pace (evaluation not counted).
      const double per_step = p.seconds / std::max<int64_t>(1, p.step_in_epoch);
      const int64_t left = (p.steps_in_epoch - p.step_in_epoch) +
                           std::max<int64_t>(0, epochs - p.epoch) * p.steps_in_epoch;
      const int64_t eta = static_cast<int64_t>(per_step * static_cast<double>(left) + 0.5);
      std::fprintf(stderr, "\repoch %lld/%lld [%s%s] %lld/%lld  %.0f samples/s  ETA %lld:%02lld ",
                   static_cast<long long>(p.epoch), static_cast<long long>(epochs),
                   std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
                   static_cast<long long>(p.step_in_epoch),
                   static_cast<long long>(p.steps_in_epoch), p.samples / std::max(1e-9, p.seconds),
                   static_cast<long long>(eta / 60), static_cast<long long>(eta % 60));
      std::fflush(stderr);
    });
  }
  // The curves so far, for --plot.
  auto curves = std::make_shared<TrainingReport>();
  curves->model = model.name;
  curves->num_workers = trainer->registration().num_workers;
  curves->global_batch_size = options.batch_size;
  const std::string plot = absl::GetFlag(FLAGS_plot);
  trainer->set_epoch_callback([bar, epochs = options.epochs, curves, plot](const EpochStats& e) {
    if (bar) std::fprintf(stderr, "\r\033[K");
    // test_accuracy is -1 when the epoch was not evaluated: say nothing then.
    std::string test =
        e.test_accuracy >= 0 ? absl::StrFormat("  test acc %.4f", e.test_accuracy) : "";
    if (e.validation_accuracy >= 0) {
      test = absl::StrCat(absl::StrFormat("  validation acc %.4f", e.validation_accuracy), test);
    }
    if (!plot.empty()) {
      while (!curves->epochs.empty() && curves->epochs.back().epoch >= e.epoch) {
        curves->epochs.pop_back();  // an epoch a recovery rolled back into
      }
      curves->epochs.push_back(e);
      if (absl::Status drawn = PlotTrainingCurves(*curves, plot); !drawn.ok()) {
        std::fprintf(stderr, "worker: --plot: %s\n", drawn.ToString().c_str());
      }
    }
    std::printf("epoch %lld/%lld  loss %.4f  train acc %.4f%s  %.0f samples/s  [%s]\n",
                static_cast<long long>(e.epoch), static_cast<long long>(epochs), e.train_loss,
                e.train_accuracy, test.c_str(), e.samples_per_second,
                FormatSplit(e.split).c_str());
    std::fflush(stdout);
  });

  trainer->set_recovery_callback([rank, m = worker_metrics.get()](const TrainingReport::Recovery& r) {
    if (m != nullptr) m->OnRecovery();
    std::printf("worker %d: the server was lost at step %lld (%s); resumed at version %lld "
                "after %.1f s\n",
                rank, static_cast<long long>(r.failed_iteration), r.error.c_str(),
                static_cast<long long>(r.resumed_version), r.seconds);
    std::fflush(stdout);
  });
  PS_ASSIGN_OR_RETURN(TrainingReport report, trainer->Run());
  if (staleness) report.staleness = staleness();
  if (!report.staleness.empty()) {
    std::vector<std::string> parts;
    for (const auto& [stale, messages] : report.staleness) {
      parts.push_back(absl::StrCat(stale, ": ", messages));
    }
    std::printf("worker %d: staleness of its pushes (updates behind: messages) %s\n", rank,
                absl::StrJoin(parts, ", ").c_str());
  }
  const std::string final_test =
      report.final_test_accuracy >= 0
          ? absl::StrFormat("final test accuracy %.4f, ", report.final_test_accuracy)
          : std::string("final ");
  std::printf("worker %d: %strain loss %.4f, %.0f samples/s (all workers: %.0f samples/s)\n",
              rank, final_test.c_str(), report.final_train_loss, report.samples_per_second,
              report.global_samples_per_second);
  if (remote && report.steps > 0) {
    // The first pull (the initial parameters) is not part of any step.
    PS_ASSIGN_OR_RETURN(std::unique_ptr<WireCodec> codec,
                        MakeWireCodec(absl::GetFlag(FLAGS_compression)));
    // What one pull of the model takes (a sparse codec's pulls are fp32).
    const int64_t model_bytes =
        codec->sparse() ? report.model_parameters * 4 : codec->EncodedBytes(report.model_parameters);
    std::printf("worker %d: pushed %.0f and pulled %.0f bytes per step (model: %lld bytes%s)\n",
                rank, static_cast<double>(bytes_pushed()) / report.steps,
                static_cast<double>(bytes_pulled() - model_bytes) / report.steps,
                static_cast<long long>(model_bytes),
                codec->name() == "none" ? ""
                : codec->sparse()
                    ? absl::StrCat(" in fp32; pushes as ", codec->name(),
                                   ", pulls as deltas where smaller").c_str()
                    : absl::StrCat(" as ", codec->name(), ", ", report.model_parameters * 4,
                                   " in fp32")
                          .c_str());
  }

  if (trainer->registration().loss_scale > 0) {
    std::printf("worker %d: dynamic loss scale %g at the end; %lld of %lld steps overflowed "
                "on this worker (each skipped by every worker)\n",
                rank, store->LossScale(), static_cast<long long>(trainer->overflow_steps()),
                static_cast<long long>(report.steps));
  }

  // Peak resident memory of the whole process, as /usr/bin/time -v reports
  // it ("Maximum resident set size"; Linux counts ru_maxrss in KiB).
  struct rusage usage = {};
  if (getrusage(RUSAGE_SELF, &usage) == 0) {
    report.peak_rss_bytes = static_cast<int64_t>(usage.ru_maxrss) * 1024;
    std::printf("worker %d: peak resident memory %.1f MB\n", rank,
                static_cast<double>(report.peak_rss_bytes) / 1e6);
  }

  if (report.stopped_at_step >= 0) {
    std::printf("worker %d: stopped by a signal after step %lld, its push and pull complete "
                "(restarted with the same --worker_id it rejoins the job)\n",
                rank, static_cast<long long>(report.stopped_at_step));
  }
  if (!absl::GetFlag(FLAGS_save_weights).empty()) {
    PS_RETURN_IF_ERROR(SaveWeights(trainer->model(), absl::GetFlag(FLAGS_save_weights)));
    std::printf("saved weights to %s\n", absl::GetFlag(FLAGS_save_weights).c_str());
  }
  if (!absl::GetFlag(FLAGS_report).empty()) {
    std::ofstream out(absl::GetFlag(FLAGS_report));
    out << TrainingReportToJson(report);
    if (!out) {
      return absl::UnavailableError(
          absl::StrCat("cannot write report to ", absl::GetFlag(FLAGS_report)));
    }
  }
  return absl::OkStatus();
}

// Main, with the timeline of --trace written when it returns, whether
// training succeeded or failed (the trainer and store are gone by then, so
// every event is in). The trace's pid is the worker's rank, which only
// registration settles: until then the --rank asked for, or 0.
absl::Status MainWithTrace(int argc, char** argv) {
  const std::string path = absl::GetFlag(FLAGS_trace);
  if (path.empty()) return Main(argc, argv, nullptr);
  ChromeTraceOptions trace_options;
  trace_options.pid = std::max(0, absl::GetFlag(FLAGS_rank));
  trace_options.process_name = absl::GetFlag(FLAGS_rank) >= 0
                                   ? absl::StrCat("worker ", absl::GetFlag(FLAGS_rank))
                                   : std::string("worker (unregistered)");
  trace_options.max_events = absl::GetFlag(FLAGS_trace_max_events);
  ChromeTraceObserver trace(trace_options);
  const absl::Status status = Main(argc, argv, &trace);
  const absl::Status written = trace.WriteTo(path);
  if (written.ok()) {
    std::printf("wrote the timeline (%lld events, %lld dropped) to %s\n",
                static_cast<long long>(trace.size()), static_cast<long long>(trace.dropped()),
                path.c_str());
    std::fflush(stdout);
  }
  // A training error is the one to report; the trace's comes second.
  if (!status.ok()) {
    if (!written.ok()) std::fprintf(stderr, "worker: %s\n", written.ToString().c_str());
    return status;
  }
  return written;
}

}  // namespace
}  // namespace ps::worker

int main(int argc, char** argv) {
  ps::worker::BlockAndTakeStopSignals();  // first: before any other thread exists
  ps::TuneMallocForLargeMessages();
  ps::DisableMutexDeadlockDetection();
  absl::SetProgramUsageMessage("Data-parallel training worker. See README.md.");
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = ps::worker::MainWithTrace(argc, argv);
  if (!status.ok()) std::fprintf(stderr, "worker: %s\n", status.ToString().c_str());
  // Stopped by SIGTERM before the end: the conventional 128 + 15, so a
  // restart policy that restarts failures brings it back to rejoin. Also
  // when the server was lost as it stopped (kCancelled: the trainer did not
  // wait for it to come back; the message says where it stopped).
  const bool stopped = ps::worker::stop_requested && (status.ok() || absl::IsCancelled(status));
  const int code = stopped ? 128 + SIGTERM : !status.ok() ? 1 : 0;
  // Without running static destructors: gRPC's threads may still be
  // reconnecting a channel the store has let go of (a refused TLS
  // handshake retries), and OpenSSL torn down under them crashed the
  // process after its last line. Everything is written and closed by now.
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(code);
}
