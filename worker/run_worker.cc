#include "worker/run_worker.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/chrome_trace.h"
#include "common/clock.h"
#include "common/cpu_device.h"
#include "common/devices.h"
#include "common/metrics.h"
#include "common/page_faults.h"
#include "common/status_macros.h"
#include "common/wire_codec.h"
#include "kernels/gemm.h"
#include "proto/parameter_server.pb.h"
#include "worker/data/loader.h"
#include "worker/local_parameter_store.h"
#include "worker/model_profiler.h"
#include "worker/remote_parameter_store.h"
#include "worker/server_check.h"
#include "worker/server_store.h"
#include "worker/time_split.h"
#include "worker/trainer.h"
#include "worker/training_plot.h"
#include "worker/weights.h"
#include "worker/worker_metrics.h"

namespace ps::worker {

bool StopRequest::Request() {
  return training_started_.load() && !requested_.exchange(true);
}

namespace {

std::string FormatSplit(const TimeSplit& s) {
  const double total = s.data + s.compute + s.reduce + s.copy + s.push + s.wait + s.pull;
  if (total <= 0) return "";
  auto pct = [&](double x) { return 100.0 * x / total; };
  return absl::StrFormat(
      "data %.0f%% compute %.0f%% reduce %.0f%% copy %.0f%% push %.0f%% wait %.0f%% pull %.0f%%",
      pct(s.data), pct(s.compute), pct(s.reduce), pct(s.copy), pct(s.push), pct(s.wait),
      pct(s.pull));
}

struct Devices {
  std::vector<std::unique_ptr<Device>> owned;
  std::vector<Device*> all;  // owned's
};

// The devices options.devices asks for, options.threads split between CPU
// devices (0: one per core).
absl::StatusOr<Devices> CreateWorkerDevices(const WorkerOptions& options) {
  const int threads = options.threads > 0
                          ? options.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  Devices devices;
  PS_ASSIGN_OR_RETURN(devices.owned, CreateDevices(options.devices, threads));
  for (auto& d : devices.owned) devices.all.push_back(d.get());
  // D CPU devices run concurrently: each BLAS call gets its device's share.
  kernels::SetBlasThreads(devices.all[0]->is_cpu() ? AsCpu(*devices.all[0]).num_threads() : 1);
  return devices;
}

struct Data {
  data::Dataset train;
  data::Dataset test;
  data::Dataset validation;  // empty without options.validation_fraction
};

absl::StatusOr<Data> LoadData(const WorkerOptions& options) {
  Data data;
  PS_ASSIGN_OR_RETURN(data.train, data::LoadDataset(options.dataset, options.data_dir, "train"));
  PS_ASSIGN_OR_RETURN(data.test, data::LoadDataset(options.dataset, options.data_dir, "test"));
  if (options.validation_fraction != 0) {
    // In place: the training set is never held twice.
    PS_ASSIGN_OR_RETURN(data::HoldoutSplit split,
                        data::SplitHoldout(std::move(data.train), options.validation_fraction,
                                           options.trainer.seed));
    data.train = std::move(split.train);
    data.validation = std::move(split.validation);
  }
  return data;
}

// --write_model_profile: `model` measured on `device` (CPU only: elsewhere
// the layer events time the host's enqueueing) on --batch_size zero samples
// (a kernel's time does not depend on the values), written as a profile.
absl::Status WriteOwnModelProfile(const WorkerOptions& options, const model::ModelConfig& model,
                                  Device* device) {
  if (!device->is_cpu()) {
    return absl::InvalidArgumentError(
        "--write_model_profile profiles on CPU devices only (pass --devices=cpu)");
  }
  PS_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> replica, model::Model::Create(model, device));
  PS_RETURN_IF_ERROR(replica->Initialize(options.trainer.seed));
  Shape batch = {options.trainer.batch_size};
  batch.insert(batch.end(), model.input_shape.begin(), model.input_shape.end());
  PS_ASSIGN_OR_RETURN(Tensor inputs, Tensor::Zeros(device, batch));
  PS_ASSIGN_OR_RETURN(Tensor labels, Tensor::Zeros(device, {batch[0]}, DType::kI32));
  ModelProfilerOptions profiler;
  profiler.model_name = model.name;
  profiler.input = absl::StrCat(absl::StrJoin(model.input_shape, "x"), " float32 zeros (",
                                options.dataset, "'s shape), ", model.num_classes,
                                " classes (cross-entropy)");
  char host[256] = "unknown";
  gethostname(host, sizeof(host) - 1);
  profiler.measured.where = absl::StrCat("the C++ worker on ", host, ", ", device->name());
  profiler.measured.date = absl::FormatTime("%Y-%m-%dT%H:%MZ", absl::Now(), absl::UTCTimeZone());
  std::ifstream cpuinfo("/proc/cpuinfo");
  profiler.measured.cpu = "unknown";
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      profiler.measured.cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  profiler.measured.cores = static_cast<int64_t>(std::max(1u, std::thread::hardware_concurrency()));
  profiler.measured.threads = AsCpu(*device).num_threads();
  profiler.measured.software = {{"ps-worker", "C++ worker (worker/model)"},
                                {"profiler", "worker --write_model_profile"}};
  PS_ASSIGN_OR_RETURN(model::ModelProfile profile,
                      MeasureModelProfile(*replica, inputs, labels, Clock::Real(), profiler));
  PS_RETURN_IF_ERROR(model::WriteModelProfile(profile, options.write_model_profile));
  std::printf("wrote the model profile of %s (batch %lld, %zu layers: forward %.2f ms, backward "
              "%.2f ms) to %s\n",
              model.name.c_str(), static_cast<long long>(profile.batch_size),
              profile.layers.size(), profile.total_forward_ms, profile.total_backward_ms,
              options.write_model_profile.c_str());
  return absl::OkStatus();
}

// --check: each of `shards` checked as this worker would connect, what to
// fix printed. A shard holds part of the model under its own names, so the
// model and steps_per_epoch are compared with one server only.
absl::Status CheckServers(const WorkerOptions& options, const std::vector<std::string>& shards,
                          const model::ModelConfig& model, Device* device,
                          int64_t steps_per_epoch) {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> probe, model::Model::Create(model, device));
  bool all_ok = true;
  for (const std::string& address : shards) {
    ServerCheckOptions check;
    check.address = address;
    check.tls = options.remote.tls;
    check.job_token = options.remote.job_token;
    if (shards.size() == 1) {
      check.signature = probe->parameters();
      check.steps_per_epoch = steps_per_epoch;
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

// Metrics (options.metrics_port >= 0): the trainer's and the store's timed
// events, the steps, and the store's calls. The endpoint is never stopped
// (the process ends with _exit, see worker_main.cc): civetweb's stop waits
// out its master thread's 2-second poll, 1.8 s at the end of a run.
absl::StatusOr<std::unique_ptr<WorkerMetrics>> StartMetrics(const WorkerOptions& options) {
  if (options.metrics_port < 0) return nullptr;
  PS_ASSIGN_OR_RETURN(
      std::unique_ptr<MetricsServer> started,
      MetricsServer::Start(absl::StrCat(options.metrics_address, ":", options.metrics_port)));
  MetricsServer* metrics = started.release();
  std::printf("metrics at http://%s:%d/metrics\n", options.metrics_address.c_str(),
              metrics->port());
  std::fflush(stdout);
  return std::make_unique<WorkerMetrics>(metrics->registry());
}

// What the heartbeats report to the server's metrics: the steps, and per
// step phase the seconds and the count since the start.
void ReportPhases(const TimeSplitObserver& phases, proto::HeartbeatRequest* request) {
  int64_t steps = 0;
  for (const PhaseSum& sum : phases.phase_sums()) {
    if (sum.kind == EventKind::kData) steps = sum.count;  // every step gathers data once
    proto::PhaseTotal* total = request->add_phases();
    total->set_phase(std::string(EventKindName(sum.kind)));
    total->set_seconds(static_cast<double>(sum.nanoseconds) / 1e9);
    total->set_count(sum.count);
  }
  request->set_steps(steps);
}

using StoreReadings = ServerStoreReadings;

// The store: the optimizer in this process, or the parameter server (which
// then owns the initial parameters and the optimizer settings), over one
// server or several shards (server_store.h). `phases` feeds the heartbeats,
// `rpc_observer` (null: none) receives the store's events; both must
// outlive the store. `readings` stays empty for the local store.
absl::StatusOr<std::unique_ptr<ParameterStore>> CreateStore(
    const WorkerOptions& options, const OptimizerOptions& optimizer,
    const TimeSplitObserver* phases, EventObserver* rpc_observer, StopRequest* stop,
    StoreReadings* readings) {
  if (options.servers.empty()) {
    PS_ASSIGN_OR_RETURN(std::unique_ptr<LocalParameterStore> local,
                        LocalParameterStore::Create(optimizer, 1, options.loss_scale));
    return std::unique_ptr<ParameterStore>(std::move(local));
  }
  RemoteStoreOptions remote = options.remote;
  remote.steps_per_epoch = optimizer.schedule.steps_per_epoch;
  remote.observer = rpc_observer;
  remote.report = [phases](proto::HeartbeatRequest* request) { ReportPhases(*phases, request); };
  remote.clock = Clock::Real();
  remote.should_stop = [stop] { return stop->requested(); };
  remote.log = [](const std::string& line) {
    std::printf("worker: %s\n", line.c_str());
    std::fflush(stdout);
  };
  PS_ASSIGN_OR_RETURN(ServerStore server, CreateServerStore(options.servers, remote));
  *readings = server.readings;
  return std::move(server.store);
}

// The lines before the first step: what runs in half precision, the
// replayed pass (launchers wait for that line before starting the next
// worker), and what trains on what.
void Announce(Trainer& trainer, const TrainerOptions& options,
              const model::ModelConfig& model, const std::vector<Device*>& devices,
              const Data& data, const std::string& optimizer_text) {
  const int rank = trainer.registration().rank;
  if (options.precision != Precision::kFp32) {
    std::printf("worker %d: precision %s: linear and convolution GEMMs on %s operands with fp32 "
                "accumulation; activations, pooling, batch norm, softmax, loss and gradients "
                "in fp32\n",
                rank, std::string(PrecisionName(options.precision)).c_str(),
                std::string(PrecisionName(options.precision)).c_str());
  }
  if (options.precision == Precision::kFp16 && trainer.registration().loss_scale == 0) {
    // Not an error (small models train), but gradients below fp16's 6e-8
    // vanish and above 65504 overflow without the server's loss scaling.
    std::fprintf(stderr,
                 "worker %d: warning: --precision=fp16 without dynamic loss scaling (start the "
                 "servers with --loss_scale=dynamic, or a worker without --server with it)\n",
                 rank);
  }
  if (const ComputeProfile* profile = trainer.replay_profile(); profile != nullptr) {
    std::printf("worker %d: replaying compute: %.3f ms per step, measured over %lld passes\n",
                rank, static_cast<double>(profile->step_ns()) / 1e6,
                static_cast<long long>(profile->passes));
    std::fflush(stdout);
  }
  std::vector<std::string> names;
  for (Device* d : devices) names.push_back(d->name());
  const std::string model_name =
      model.profile != nullptr ? absl::StrCat("the profile of ", model.profile->model) : model.name;
  std::printf("worker %d/%d: training %s (%lld parameters) on %s: %lld train / %lld test "
              "samples, global batch %lld, %s, %lld epochs\n",
              rank, trainer.registration().num_workers, model_name.c_str(),
              static_cast<long long>(model::TotalElements(trainer.model().parameters())),
              absl::StrJoin(names, ",").c_str(), static_cast<long long>(data.train.size()),
              static_cast<long long>(data.test.size()), static_cast<long long>(options.batch_size),
              optimizer_text.c_str(), static_cast<long long>(options.epochs));
  std::fflush(stdout);
}

// The process's minor page faults at the end of each step, for the
// report's faults per step in steady state: over the second half of the
// steps, since allocators and connections keep warming up for a while
// (MLP-20M: its faults came in the first 8 s of 60 steps).
struct StepFaults {
  std::vector<int64_t> after_step;
  // Faults per step over the second half of the steps; -1 with fewer than
  // two steps or no count.
  double PerStep() const {
    const size_t n = after_step.size();
    if (n < 2 || after_step.front() < 0) return -1;
    const size_t half = n / 2;
    return static_cast<double>(after_step[n - 1] - after_step[half - 1]) /
           static_cast<double>(n - half);
  }
};

// After every step: the faults so far, the metrics' steps and staleness,
// and the progress bar (when `bar`) every 5 steps and at the end of an
// epoch.
void ShowSteps(Trainer& trainer, bool bar, int64_t epochs, WorkerMetrics* metrics,
               const StoreReadings& readings, StepFaults* faults) {
  trainer.set_step_callback([bar, epochs, metrics, faults,
                             staleness = readings.staleness](const StepProgress& p) {
    faults->after_step.push_back(ProcessMinorFaults());
    if (metrics != nullptr) {
      metrics->OnStep(p.epoch, p.step_in_epoch, p.samples);
      if (staleness) metrics->SetStaleness(staleness());
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

// After every epoch: its line, and the curves so far redrawn (`plot`, empty:
// none).
void ShowEpochs(Trainer& trainer, bool bar, int64_t epochs, std::shared_ptr<TrainingReport> curves,
                const std::string& plot) {
  trainer.set_epoch_callback([bar, epochs, curves, plot](const EpochStats& e) {
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
}

void ShowRecoveries(Trainer& trainer, WorkerMetrics* metrics) {
  trainer.set_recovery_callback(
      [rank = trainer.registration().rank, metrics](const TrainingReport::Recovery& r) {
        if (metrics != nullptr) metrics->OnRecovery();
        std::printf("worker %d: the server was lost at step %lld (%s); resumed at version %lld "
                    "after %.1f s\n",
                    rank, static_cast<long long>(r.failed_iteration), r.error.c_str(),
                    static_cast<long long>(r.resumed_version), r.seconds);
        std::fflush(stdout);
      });
}

// A server job's bytes per step, against what one pull of the model takes.
absl::Status PrintTraffic(int rank, const TrainingReport& report, const std::string& compression,
                          const StoreReadings& readings) {
  // The first pull (the initial parameters) is not part of any step.
  PS_ASSIGN_OR_RETURN(std::unique_ptr<WireCodec> codec, MakeWireCodec(compression));
  // What one pull of the model takes (a sparse codec's pulls are fp32).
  const int64_t model_bytes =
      codec->sparse() ? report.model_parameters * 4 : codec->EncodedBytes(report.model_parameters);
  std::printf("worker %d: pushed %.0f and pulled %.0f bytes per step (model: %lld bytes%s)\n",
              rank, static_cast<double>(readings.bytes_pushed()) / report.steps,
              static_cast<double>(readings.bytes_pulled() - model_bytes) / report.steps,
              static_cast<long long>(model_bytes),
              codec->name() == "none" ? ""
              : codec->sparse()
                  ? absl::StrCat(" in fp32; pushes as ", codec->name(),
                                 ", pulls as deltas where smaller").c_str()
                  : absl::StrCat(" as ", codec->name(), ", ", report.model_parameters * 4,
                                 " in fp32")
                        .c_str());
  return absl::OkStatus();
}

// The lines after the last step; fills in report.staleness and
// report.peak_rss_bytes.
absl::Status Summarize(const WorkerOptions& options, const Trainer& trainer,
                       const ParameterStore& store, const StoreReadings& readings,
                       TrainingReport& report) {
  const int rank = trainer.registration().rank;
  if (readings.staleness) report.staleness = readings.staleness();
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
  if (readings.remote() && report.steps > 0) {
    PS_RETURN_IF_ERROR(PrintTraffic(rank, report, options.remote.compression, readings));
  }
  if (trainer.registration().loss_scale > 0) {
    std::printf("worker %d: dynamic loss scale %g at the end; %lld of %lld steps overflowed "
                "on this worker (each skipped by every worker)\n",
                rank, store.LossScale(), static_cast<long long>(trainer.overflow_steps()),
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
  if (report.minor_faults_per_step >= 0) {
    std::printf("worker %d: %.0f minor page faults per step over the second half of the steps "
                "(fresh pages touched; about one per 4 KiB received where received bytes land "
                "in fresh memory)\n",
                rank, report.minor_faults_per_step);
  }
  if (report.stopped_at_step >= 0) {
    std::printf("worker %d: stopped by a signal after step %lld, its push and pull complete "
                "(restarted with the same --worker_id and --identity_file it rejoins the job)\n",
                rank, static_cast<long long>(report.stopped_at_step));
  }
  return absl::OkStatus();
}

// options.save_weights and options.report, when set.
absl::Status WriteOutputs(const WorkerOptions& options, Trainer& trainer,
                          const TrainingReport& report) {
  if (!options.save_weights.empty()) {
    PS_RETURN_IF_ERROR(SaveWeights(trainer.model(), options.save_weights));
    std::printf("saved weights to %s\n", options.save_weights.c_str());
  }
  if (!options.report.empty()) {
    std::ofstream out(options.report);
    out << TrainingReportToJson(report);
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write report to ", options.report));
  }
  return absl::OkStatus();
}

// `trace` (null without options.trace) receives the trainer's and the
// store's events on one clock.
absl::Status Train(const WorkerOptions& options, StopRequest* stop, ChromeTraceObserver* trace) {
  PS_ASSIGN_OR_RETURN(Devices devices, CreateWorkerDevices(options));
  PS_ASSIGN_OR_RETURN(Data data, LoadData(options));
  model::ModelConfig model = options.model;
  model.input_shape = data.train.sample_shape;
  model.num_classes = data.train.num_classes;
  if (!options.model_profile.empty()) {
    PS_ASSIGN_OR_RETURN(model::ModelProfile profile,
                        model::ReadModelProfile(options.model_profile));
    model.profile = std::make_shared<const model::ModelProfile>(std::move(profile));
  }
  if (!options.write_model_profile.empty()) {
    return WriteOwnModelProfile(options, model, devices.all[0]);
  }

  // The trainer's events go to the timeline (if any), to the totals the
  // heartbeats report, and to the metrics (added below).
  TimeSplitObserver phases;
  ObserverFanOut observers;  // declared before, so destroyed after, the trainer and store
  observers.Add(&phases);
  if (trace != nullptr) observers.Add(trace);
  TrainerOptions trainer_options = options.trainer;
  trainer_options.observer = &observers;
  trainer_options.clock = Clock::Real();
  if (options.normalize) {
    PS_ASSIGN_OR_RETURN(trainer_options.normalization, data::ComputeNormalization(data.train));
  }
  OptimizerOptions optimizer = options.optimizer;
  optimizer.schedule.steps_per_epoch =
      (data.train.size() + trainer_options.batch_size - 1) / trainer_options.batch_size;

  const std::vector<std::string> shards = SplitServerList(options.servers);
  if (options.check) {
    return CheckServers(options, shards, model, devices.all[0],
                        optimizer.schedule.steps_per_epoch);
  }
  // Declared before the store and the trainer, which report to them.
  PS_ASSIGN_OR_RETURN(std::unique_ptr<WorkerMetrics> metrics, StartMetrics(options));
  ObserverFanOut rpc_observers;  // the store's events: the timeline and the metrics
  if (trace != nullptr) rpc_observers.Add(trace);
  if (metrics != nullptr) {
    observers.Add(metrics.get());
    rpc_observers.Add(metrics.get());
  }
  StoreReadings readings;
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ParameterStore> store,
                      CreateStore(options, optimizer, &phases,
                                  rpc_observers.empty() ? nullptr : &rpc_observers, stop,
                                  &readings));
  if (metrics != nullptr) {
    // Counts the pipeline's calls in flight.
    store = std::make_unique<MeteredParameterStore>(std::move(store), metrics.get());
  }
  trainer_options.recover_from_server_loss =
      readings.remote() && options.trainer.recover_from_server_loss;
  trainer_options.should_stop = [stop] { return stop->requested(); };
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                      Trainer::Create(trainer_options, model, devices.all, store.get(),
                                      &data.train, &data.test,
                                      data.validation.size() > 0 ? &data.validation : nullptr));
  // Registered: from here a stop request ends training after the step in
  // progress.
  stop->TrainingStarted();
  const int rank = trainer->registration().rank;
  if (trace != nullptr) trace->set_process(rank, absl::StrCat("worker ", rank));
  const std::string optimizer_text =
      !readings.remote()  ? absl::StrFormat("lr %g", optimizer.sgd.lr)
      : shards.size() > 1 ? absl::StrCat("optimizer on ", shards.size(), " server shards")
                          : std::string("optimizer on the server");
  Announce(*trainer, trainer_options, model, devices.all, data, optimizer_text);

  const bool bar = options.progress && isatty(STDERR_FILENO);
  StepFaults faults;
  ShowSteps(*trainer, bar, trainer_options.epochs, metrics.get(), readings, &faults);
  auto curves = std::make_shared<TrainingReport>();  // the curves so far, for options.plot
  curves->model = model.name;
  curves->num_workers = trainer->registration().num_workers;
  curves->global_batch_size = trainer_options.batch_size;
  ShowEpochs(*trainer, bar, trainer_options.epochs, curves, options.plot);
  ShowRecoveries(*trainer, metrics.get());
  PS_ASSIGN_OR_RETURN(TrainingReport report, trainer->Run());
  report.minor_faults_per_step = faults.PerStep();
  PS_RETURN_IF_ERROR(Summarize(options, *trainer, *store, readings, report));
  PS_RETURN_IF_ERROR(WriteOutputs(options, *trainer, report));
  return absl::OkStatus();
}

}  // namespace

// Train, with the timeline of options.trace written when it returns, whether
// training succeeded or failed (the trainer and store are gone by then, so
// every event is in). The trace's pid is the worker's rank, which only
// registration settles: until then the rank asked for, or 0.
absl::Status RunWorker(const WorkerOptions& options, StopRequest* stop) {
  if (options.trace.empty()) return Train(options, stop, nullptr);
  ChromeTraceOptions trace_options;
  trace_options.pid = std::max(0, options.remote.rank);
  trace_options.process_name = options.remote.rank >= 0
                                   ? absl::StrCat("worker ", options.remote.rank)
                                   : std::string("worker (unregistered)");
  trace_options.max_events = options.trace_max_events;
  ChromeTraceObserver trace(trace_options);
  const absl::Status status = Train(options, stop, &trace);
  const absl::Status written = trace.WriteTo(options.trace);
  if (written.ok()) {
    std::printf("wrote the timeline (%lld events, %lld dropped) to %s\n",
                static_cast<long long>(trace.size()), static_cast<long long>(trace.dropped()),
                options.trace.c_str());
    std::fflush(stdout);
  }
  // A training error is the one to report; the trace's comes second.
  if (!status.ok()) {
    if (!written.ok()) std::fprintf(stderr, "worker: %s\n", written.ToString().c_str());
    return status;
  }
  return written;
}

}  // namespace ps::worker
