#include "worker/trainer.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/cpu_device.h"
#include "common/fake_device.h"
#include "common/timed_event.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/compute_mode_test_util.h"
#include "worker/data/synthetic.h"
#include "worker/fake_stores.h"
#include "worker/local_parameter_store.h"
#include "worker/trainer_test_util.h"

namespace ps::worker {
namespace {

using testing::MomentumSgd;
using testing::SyntheticDataset;

// d CPU devices of one thread each (StagedCpuDevice, whose memory says it
// is not host memory, when `staged`) and the pointers the trainer takes.
struct TestDevices {
  std::vector<std::unique_ptr<CpuDevice>> owned;
  std::vector<Device*> devices;
};
TestDevices MakeDevices(int d, bool staged) {
  TestDevices out;
  for (int i = 0; i < d; ++i) {
    out.owned.push_back(staged ? std::make_unique<StagedCpuDevice>(i, 1)
                               : std::make_unique<CpuDevice>(i, 1));
    out.devices.push_back(out.owned.back().get());
  }
  return out;
}

// Trains `steps` steps with `d` CPU devices (1 thread each) and returns the
// final parameters. `staged`: devices that say their memory is not host
// memory (StagedCpuDevice), so the trainer takes a CUDA device's path.
std::vector<float> TrainWithDevices(const std::string& model_name, int d, int64_t batch,
                                    int64_t steps, const data::Dataset& data,
                                    int64_t* bytes_to_host, int64_t* bytes_to_device,
                                    bool staged = false, bool overlap = true,
                                    int64_t* store_bytes_copied = nullptr,
                                    int64_t linear_block_rows = 0) {
  const TestDevices cpus = MakeDevices(d, staged);
  const std::vector<Device*>& devices = cpus.devices;
  auto store = LocalParameterStore::Create(MomentumSgd());
  EXPECT_TRUE(store.ok()) << store.status();
  TrainerOptions options;
  options.batch_size = batch;
  options.epochs = 1;
  options.max_steps = steps;
  options.seed = 7;
  options.evaluate = false;
  options.overlap = overlap;
  model::ModelConfig model;
  model.name = model_name;
  model.mlp_hidden = {32};
  model.linear_block_rows = linear_block_rows;
  auto trainer = Trainer::Create(options, model, devices, store->get(), &data, nullptr);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  auto report = (*trainer)->Run();
  EXPECT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->steps, steps);
  if (bytes_to_host != nullptr) {
    *bytes_to_host = static_cast<int64_t>(report->model_bytes_to_host_per_step);
    *bytes_to_device = static_cast<int64_t>(report->model_bytes_to_device_per_step);
  }
  if (store_bytes_copied != nullptr) *store_bytes_copied = (*store)->bytes_copied();
  auto params = (*trainer)->model().flat_parameters().ToVector();
  EXPECT_TRUE(params.ok());
  return *params;
}

void ExpectRelativelyClose(const std::vector<float>& a, const std::vector<float>& b, double rtol,
                           const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  double worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double err = std::fabs(double(a[i]) - b[i]) / std::max(1e-3, std::fabs(double(b[i])));
    if (err > worst) {
      worst = err;
      worst_i = i;
    }
  }
  EXPECT_LE(worst, rtol) << what << ": element " << worst_i << " " << a[worst_i] << " vs "
                         << b[worst_i];
}

// Issue 3's promise: D devices on one batch give the update of one device,
// also when the batch does not divide by D.
TEST(TrainerTest, OneStepIsTheSameOnOneTwoAndThreeDevices) {
  const data::Dataset data = SyntheticDataset(512);
  for (const char* model : {"mlp", "lenet"}) {
    for (int64_t batch : {64, 37}) {
      const auto one = TrainWithDevices(model, 1, batch, 1, data, nullptr, nullptr);
      for (int d : {2, 3}) {
        const auto many = TrainWithDevices(model, d, batch, 1, data, nullptr, nullptr);
        ExpectRelativelyClose(many, one, 1e-5,
                              absl::StrCat(model, " batch ", batch, " on ", d, " devices"));
      }
    }
  }
}

// A CPU device 0's memory is host memory: pushes read its gradients and
// pulls write its parameters in place, and the local store updates them
// there, so no model bytes are copied between host buffers, whatever D
// (trainer_gpu_test checks the one copy each way of a CUDA device 0).
TEST(TrainerTest, CpuDevicesCopyNoModelBytesBetweenHostBuffers) {
  const data::Dataset data = SyntheticDataset(256);
  for (int d : {1, 2, 3}) {
    for (bool overlap : {true, false}) {
      int64_t to_host = -1, to_device = -1, store_copied = -1;
      TrainWithDevices("lenet", d, 60, 3, data, &to_host, &to_device, /*staged=*/false, overlap,
                       &store_copied);
      EXPECT_EQ(to_host, 0) << d << " devices";
      EXPECT_EQ(to_device, 0) << d << " devices";
      EXPECT_EQ(store_copied, 0) << d << " devices";
    }
  }
}

// The other side of the distinction: devices whose memory is not host
// memory (a CUDA device's path, here on CPU arithmetic) copy one model's
// worth each way per step through device 0, and end with the same
// parameters, bit for bit, as CPU devices that copy nothing (with overlap
// on one device and without it).
TEST(TrainerTest, OnlyDevicesWithoutHostMemoryCopyModelBytes) {
  const data::Dataset data = SyntheticDataset(256);
  for (int d : {1, 2}) {
    for (bool overlap : {true, false}) {
      SCOPED_TRACE(absl::StrCat(d, " devices, overlap ", overlap));
      int64_t host_to_host = -1, host_to_device = -1;
      const auto in_place = TrainWithDevices("lenet", d, 60, 3, data, &host_to_host,
                                             &host_to_device, /*staged=*/false, overlap);
      EXPECT_EQ(host_to_host, 0);
      EXPECT_EQ(host_to_device, 0);
      int64_t to_host = -1, to_device = -1;
      const auto staged = TrainWithDevices("lenet", d, 60, 3, data, &to_host, &to_device,
                                           /*staged=*/true, overlap);
      const int64_t model_bytes = static_cast<int64_t>(in_place.size() * sizeof(float));
      EXPECT_GT(model_bytes, 0);
      EXPECT_EQ(to_host, model_bytes);
      EXPECT_EQ(to_device, model_bytes);
      EXPECT_EQ(staged, in_place);
    }
  }
}

// Overlap on several CPU devices sums each region of the replicas'
// gradients as soon as all have it, in the collective's order: the same
// parameters, bit for bit, as summing after the whole backward; also with
// uneven shards and a replica without samples (batch 2 on 3 devices).
TEST(TrainerTest, OverlapOnSeveralDevicesIsBitIdenticalToPushingAfterBackward) {
  const data::Dataset data = SyntheticDataset(512);
  for (const char* model : {"mlp", "lenet"}) {
    for (int d : {2, 3}) {
      for (int64_t batch : {64, 37, 2}) {
        SCOPED_TRACE(absl::StrCat(model, " on ", d, " devices, batch ", batch));
        const auto after = TrainWithDevices(model, d, batch, 3, data, nullptr, nullptr,
                                            /*staged=*/false, /*overlap=*/false);
        const auto overlapped = TrainWithDevices(model, d, batch, 3, data, nullptr, nullptr,
                                                 /*staged=*/false, /*overlap=*/true);
        EXPECT_EQ(overlapped, after);
      }
    }
  }
}

// Overlap on one device whose memory is not host memory (a CUDA device's
// path, here on CPU arithmetic: worker/device_overlap.h) copies each region
// of gradients to the host as backward reaches it and each layer's
// parameters to the device before its forward: the same parameters, bit for
// bit, as copying the whole model each way after backward, and still one
// model's worth each way per step; also with a linear layer in blocks
// (several reports and waits per layer) and an uneven last batch.
TEST(TrainerTest, OverlapOnOneStagedDeviceIsBitIdenticalToCopyingAfterBackward) {
  const data::Dataset data = SyntheticDataset(512);
  for (const char* model : {"mlp", "lenet"}) {
    for (int64_t batch : {64, 37}) {
      for (int64_t block_rows : {0, 8}) {
        SCOPED_TRACE(absl::StrCat(model, " batch ", batch, " linear_block_rows ", block_rows));
        int64_t to_host = -1, to_device = -1;
        const auto after = TrainWithDevices(model, 1, batch, 5, data, &to_host, &to_device,
                                            /*staged=*/true, /*overlap=*/false, nullptr,
                                            block_rows);
        int64_t overlap_to_host = -1, overlap_to_device = -1;
        const auto overlapped =
            TrainWithDevices(model, 1, batch, 5, data, &overlap_to_host, &overlap_to_device,
                             /*staged=*/true, /*overlap=*/true, nullptr, block_rows);
        EXPECT_EQ(overlapped, after);
        const int64_t model_bytes = static_cast<int64_t>(after.size() * sizeof(float));
        EXPECT_EQ(to_host, model_bytes);
        EXPECT_EQ(to_device, model_bytes);
        EXPECT_EQ(overlap_to_host, model_bytes);
        EXPECT_EQ(overlap_to_device, model_bytes);
      }
    }
  }
}

// One log, in the order things happened, of layer passes ending (events on
// the device lanes) and pushes starting (the store's calls).
class OrderLog final : public EventObserver {
 public:
  struct Entry {
    bool push = false;
    int64_t step = 0;  // the event's step, or the push's iteration
    int32_t lane = 0;
  };
  void OnEvent(const TimedEvent& event) override {
    if (event.kind != EventKind::kBackward) return;
    absl::MutexLock lock(&mu_);
    entries_.push_back({false, event.step, event.lane});
  }
  void Push(int64_t iteration) {
    absl::MutexLock lock(&mu_);
    entries_.push_back({true, iteration, kTrainerLane});
  }
  std::vector<Entry> entries() const {
    absl::MutexLock lock(&mu_);
    return entries_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
};

// A LocalParameterStore whose pushes are logged as they start.
class LoggingStore final : public testing::ForwardingStore {
 public:
  LoggingStore(ParameterStore* inner, OrderLog* log) : ForwardingStore(inner), log_(log) {}
  void PushSegments(int64_t iteration, int64_t num_samples, int first, int last,
                    absl::Span<const float> gradients, Done done) override {
    log_->Push(iteration);
    ForwardingStore::PushSegments(iteration, num_samples, first, last, gradients,
                                  std::move(done));
  }

 private:
  OrderLog* const log_;
};

// With 2 and 3 CPU devices, and with one device whose memory is not host
// memory (its gradients copied to the host region by region), a step's
// first push starts before its backward ends (before the last layer pass of
// the slowest replica), in every step.
TEST(TrainerEventsTest, TheFirstPushStartsBeforeBackwardEnds) {
  const data::Dataset data = SyntheticDataset(512);
  for (const auto& [d, staged] : {std::pair{2, false}, std::pair{3, false}, std::pair{1, true}}) {
    SCOPED_TRACE(absl::StrCat(d, " devices", staged ? ", staged" : ""));
    const TestDevices cpus = MakeDevices(d, staged);
    const std::vector<Device*>& devices = cpus.devices;
    auto local = LocalParameterStore::Create(MomentumSgd());
    ASSERT_TRUE(local.ok()) << local.status();
    OrderLog log;
    LoggingStore store(local->get(), &log);
    TrainerOptions options;
    options.batch_size = 96;
    options.epochs = 1;
    options.max_steps = 4;
    options.evaluate = false;
    options.observer = &log;
    // A bucket per layer: the last layer's is pushed while the ones in
    // front of it are still computing their gradients.
    options.push_pull.bucket_bytes = 0;
    model::ModelConfig model;
    model.name = "mlp";
    model.mlp_hidden = {256, 256, 256};
    auto trainer = Trainer::Create(options, model, devices, &store, &data, nullptr);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    ASSERT_TRUE((*trainer)->Run().ok());
    const std::vector<OrderLog::Entry> entries = log.entries();
    for (int64_t step = 0; step < options.max_steps; ++step) {
      SCOPED_TRACE(absl::StrCat("step ", step));
      int64_t first_push = -1, last_backward = -1;
      for (size_t i = 0; i < entries.size(); ++i) {
        if (entries[i].step != step) continue;
        if (entries[i].push && first_push < 0) first_push = static_cast<int64_t>(i);
        if (!entries[i].push) last_backward = static_cast<int64_t>(i);
      }
      ASSERT_GE(first_push, 0);
      EXPECT_LT(first_push, last_backward);
    }
  }
}

// A LocalParameterStore whose server is lost once: the first push of
// iteration `lose_at` fails as a lost server's would (before any of that
// iteration's pushes reach the store), and Reconnect finds it again at
// version `lose_at`.
class LosingStore final : public testing::ForwardingStore {
 public:
  LosingStore(ParameterStore* inner, int64_t lose_at)
      : ForwardingStore(inner), lose_at_(lose_at) {}
  absl::StatusOr<Registration> Register(const std::vector<ParamSpec>& signature,
                                        absl::Span<const float> initial) override {
    auto registration = inner()->Register(signature, initial);
    if (registration.ok()) registration_ = *registration;
    return registration;
  }
  absl::StatusOr<Registration> Reconnect(const std::vector<ParamSpec>&,
                                         absl::Span<const float>) override {
    Registration registration = registration_;
    registration.version = lose_at_;
    return registration;
  }
  void PushSegments(int64_t iteration, int64_t num_samples, int first, int last,
                    absl::Span<const float> gradients, Done done) override {
    if (iteration == lose_at_ && !lost_) {
      lost_ = true;
      done(absl::UnavailableError("server lost (injected)"));
      return;
    }
    inner()->PushSegments(iteration, num_samples, first, last, gradients, std::move(done));
  }

 private:
  const int64_t lose_at_;
  Registration registration_;
  bool lost_ = false;  // pushes come one at a time, from one thread at a time
};

// One device whose memory is not host memory, overlapping: a server lost
// mid-run is found again and the step redone from its version (its copies
// drained before the scheduler goes, the whole model copied to the device
// again), ending bit-identical to a run without the loss.
TEST(TrainerTest, OverlapOnOneStagedDeviceRecoversALostServerBitForBit) {
  const data::Dataset data = SyntheticDataset(512);
  auto train = [&](int64_t lose_at, int64_t* recoveries) {
    StagedCpuDevice device(0, 1);
    auto local = LocalParameterStore::Create(MomentumSgd());
    EXPECT_TRUE(local.ok()) << local.status();
    LosingStore store(local->get(), lose_at);
    TrainerOptions options;
    options.batch_size = 64;
    options.epochs = 1;
    options.max_steps = 5;
    options.seed = 7;
    options.evaluate = false;
    model::ModelConfig model;
    model.name = "mlp";
    model.mlp_hidden = {32};
    auto trainer = Trainer::Create(options, model, {&device}, &store, &data, nullptr);
    EXPECT_TRUE(trainer.ok()) << trainer.status();
    auto report = (*trainer)->Run();
    EXPECT_TRUE(report.ok()) << report.status();
    *recoveries = static_cast<int64_t>(report->recoveries.size());
    return *(*trainer)->model().flat_parameters().ToVector();
  };
  int64_t none = -1, one = -1;
  const auto clean = train(/*lose_at=*/-1, &none);
  const auto recovered = train(/*lose_at=*/2, &one);
  EXPECT_EQ(none, 0);
  EXPECT_EQ(one, 1);
  EXPECT_EQ(recovered, clean);
}

TEST(TrainerTest, CpuRunsAreBitReproducible) {
  const data::Dataset data = SyntheticDataset(256);
  const auto a = TrainWithDevices("lenet", 1, 32, 5, data, nullptr, nullptr);
  const auto b = TrainWithDevices("lenet", 1, 32, 5, data, nullptr, nullptr);
  EXPECT_EQ(a, b);
}

TEST(TrainerTest, LearnsTheSyntheticTask) {
  const data::Dataset train = SyntheticDataset(2048);
  data::SyntheticOptions test_options;
  test_options.size = 512;
  test_options.first_index = 1 << 20;
  auto test = data::MakeSyntheticDataset(test_options);
  ASSERT_TRUE(test.ok());
  CpuDevice device(0, 2);
  auto store = LocalParameterStore::Create(MomentumSgd());
  ASSERT_TRUE(store.ok());
  TrainerOptions options;
  options.batch_size = 64;
  options.epochs = 2;
  model::ModelConfig model;
  model.name = "mlp";
  model.mlp_hidden = {64};
  auto trainer = Trainer::Create(options, model, {&device}, store->get(), &train, &*test);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  std::vector<EpochStats> seen;
  (*trainer)->set_epoch_callback([&](const EpochStats& e) { seen.push_back(e); });
  auto report = (*trainer)->Run();
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_LT(seen[1].train_loss, seen[0].train_loss);
  EXPECT_GT(report->final_test_accuracy, 0.9);
  EXPECT_EQ(report->steps, 2 * 32);
  const std::string json = TrainingReportToJson(*report);
  for (const char* key : {"\"final_test_accuracy\"", "\"final_train_loss\"",
                          "\"samples_per_second\"", "\"epochs\"", "\"time_split\""}) {
    EXPECT_NE(json.find(key), std::string::npos) << key;
  }
}

TEST(TrainerTest, RejectsMismatchedDataAndBadOptions) {
  const data::Dataset data = SyntheticDataset(64);
  CpuDevice device(0, 1);
  auto store = LocalParameterStore::Create(MomentumSgd());
  model::ModelConfig model;
  model.input_shape = {3, 32, 32};
  auto trainer = Trainer::Create(TrainerOptions(), model, {&device}, store->get(), &data, nullptr);
  EXPECT_EQ(trainer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(trainer.status().message().find("[1, 28, 28]"), absl::string_view::npos);
  TrainerOptions bad;
  bad.batch_size = 0;
  EXPECT_EQ(Trainer::Create(bad, model::ModelConfig(), {&device}, store->get(), &data, nullptr)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// A sum-only server as the store sees it: it registers, saying its
// versions are mean gradients (--optimizer=none); nothing else may be
// reached.
class SumOnlyServerStore final : public ParameterStore {
 public:
  absl::StatusOr<Registration> Register(const std::vector<ParamSpec>&,
                                        absl::Span<const float>) override {
    Registration registration;
    registration.optimizer = "none";
    return registration;
  }
  absl::Status Push(int64_t, int64_t, absl::Span<const float>) override { return Reached(); }
  absl::Status WaitForVersion(int64_t) override { return Reached(); }
  absl::StatusOr<int64_t> Pull(int64_t, absl::Span<float>) override { return Reached(); }
  std::vector<int64_t> SegmentEnds() const override { return {}; }
  void PushSegments(int64_t, int64_t, int, int, absl::Span<const float>, Done done) override {
    done(Reached());
  }
  void PullSegments(int64_t, int, int, absl::Span<float>, Done done) override {
    done(Reached());
  }

 private:
  static absl::Status Reached() {
    ADD_FAILURE() << "the trainer used a store it should have refused";
    return absl::InternalError("reached");
  }
};

// The trainer applies no optimizer of its own: against a server that
// publishes mean gradients it refuses to train, before any step, and says
// what to use instead.
TEST(TrainerTest, RefusesASumOnlyServerBeforeItsFirstStep) {
  const data::Dataset data = SyntheticDataset(64);
  CpuDevice device(0, 1);
  SumOnlyServerStore store;
  model::ModelConfig model;
  model.name = "mlp";
  model.mlp_hidden = {8};
  auto trainer = Trainer::Create(TrainerOptions(), model, {&device}, &store, &data, nullptr);
  EXPECT_EQ(trainer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(trainer.status().message()),
              ::testing::HasSubstr("the server publishes mean gradients (--optimizer=none)"));
  EXPECT_THAT(std::string(trainer.status().message()),
              ::testing::HasSubstr("use ps.torch with a local optimizer (see docs/training.md"));
}

// A fake clock that moves 1 us at every reading, so every event has a known,
// nonzero duration and runs compare exactly.
class TickingClock final : public Clock {
 public:
  int64_t NowNanos() const override { return now_ns_.fetch_add(1000) + 1000; }

 private:
  mutable std::atomic<int64_t> now_ns_{0};
};

// Every event, with its name copied and the thread it came from.
class RecordingObserver final : public EventObserver {
 public:
  struct Record {
    TimedEvent event;
    std::string name;
    std::thread::id thread;
  };

  void OnEvent(const TimedEvent& event) override {
    absl::MutexLock lock(&mu_);
    records_.push_back({event, std::string(event.name), std::this_thread::get_id()});
    records_.back().event.name = {};  // the original is valid during OnEvent only
  }

  std::vector<Record> records() const {
    absl::MutexLock lock(&mu_);
    return records_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<Record> records_;
};

struct ObservedRun {
  TrainingReport report;
  std::vector<RecordingObserver::Record> records;
  std::thread::id trainer_thread;
};

// Runs `steps` steps of lenet on `d` CPU devices with a RecordingObserver and
// a TickingClock.
ObservedRun RunObserved(int d, int64_t steps, bool overlap = false) {
  const data::Dataset data = SyntheticDataset(256);
  const TestDevices cpus = MakeDevices(d, false);
  const std::vector<Device*>& devices = cpus.devices;
  auto store = LocalParameterStore::Create(MomentumSgd());
  EXPECT_TRUE(store.ok()) << store.status();
  TickingClock clock;
  RecordingObserver observer;
  TrainerOptions options;
  options.batch_size = 32;
  options.epochs = 1;
  options.max_steps = steps;
  options.evaluate = false;
  options.observer = &observer;
  options.clock = &clock;
  options.overlap = overlap;
  model::ModelConfig model;
  model.name = "lenet";
  ObservedRun out;
  out.trainer_thread = std::this_thread::get_id();
  auto trainer = Trainer::Create(options, model, devices, store->get(), &data, nullptr);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (!trainer.ok()) return out;
  auto report = (*trainer)->Run();
  EXPECT_TRUE(report.ok()) << report.status();
  if (report.ok()) out.report = *report;
  out.records = observer.records();
  return out;
}

// A step's phases without overlap on CPU devices (no copy to host: pushes
// read device 0's memory).
const EventKind kPhases[] = {EventKind::kData, EventKind::kCompute, EventKind::kReduce,
                             EventKind::kPush, EventKind::kPull,    EventKind::kCopyToDevice};

TEST(TrainerEventsTest, TheTimeSplitSumsExactlyWhatThePhaseEventsSaid) {
  for (int d : {1, 2}) {
    SCOPED_TRACE(absl::StrCat(d, " devices"));
    const ObservedRun run = RunObserved(d, 3);
    std::map<EventKind, int64_t> ns;
    for (const auto& r : run.records) {
      if (r.event.lane == kTrainerLane) ns[r.event.kind] += r.event.end_ns - r.event.start_ns;
    }
    for (EventKind kind : kPhases) EXPECT_GT(ns[kind], 0) << EventKindName(kind);
    EXPECT_EQ(ns[EventKind::kCopyToHost], 0);
    EXPECT_EQ(ns[EventKind::kWait], 0);
    TimeSplit want;
    want.data = ns[EventKind::kData] / 1e9;
    want.compute = ns[EventKind::kCompute] / 1e9;
    want.reduce = ns[EventKind::kReduce] / 1e9;
    want.copy = (ns[EventKind::kCopyToHost] + ns[EventKind::kCopyToDevice]) / 1e9;
    want.push = ns[EventKind::kPush] / 1e9;
    want.wait = ns[EventKind::kWait] / 1e9;
    want.pull = ns[EventKind::kPull] / 1e9;
    ASSERT_EQ(run.report.epochs.size(), 1u);
    for (const TimeSplit& got : {run.report.split, run.report.epochs[0].split}) {
      EXPECT_EQ(got.data, want.data);
      EXPECT_EQ(got.compute, want.compute);
      EXPECT_EQ(got.reduce, want.reduce);
      EXPECT_EQ(got.copy, want.copy);
      EXPECT_EQ(got.push, want.push);
      EXPECT_EQ(got.wait, want.wait);
      EXPECT_EQ(got.pull, want.pull);
    }
    // The epoch is timed on the same clock and holds all of its steps.
    int64_t phase_ns = 0;
    for (const auto& [kind, n] : ns) phase_ns += n;
    EXPECT_GE(run.report.epochs[0].train_seconds, phase_ns / 1e9);
  }
}

TEST(TrainerEventsTest, EachStepReportsEveryPhaseOnceInOrderBackToBack) {
  for (int d : {1, 3}) {
    SCOPED_TRACE(absl::StrCat(d, " devices"));
    constexpr int64_t kSteps = 3;
    const ObservedRun run = RunObserved(d, kSteps);
    std::map<int64_t, std::vector<TimedEvent>> by_step;
    for (const auto& r : run.records) {
      if (r.event.lane != kTrainerLane) continue;
      EXPECT_EQ(r.thread, run.trainer_thread) << "trainer-lane events come from the trainer";
      by_step[r.event.step].push_back(r.event);
    }
    ASSERT_EQ(by_step.size(), static_cast<size_t>(kSteps));
    int64_t expected_step = 0;
    for (const auto& [step, events] : by_step) {
      EXPECT_EQ(step, expected_step++);
      ASSERT_EQ(events.size(), std::size(kPhases)) << "step " << step;
      for (size_t i = 0; i < events.size(); ++i) {
        EXPECT_EQ(events[i].kind, kPhases[i]) << "step " << step << " event " << i;
        EXPECT_LT(events[i].start_ns, events[i].end_ns);
        if (i > 0) {
          EXPECT_EQ(events[i].start_ns, events[i - 1].end_ns) << "a gap before " << i;
        }
        const bool transfer = events[i].kind == EventKind::kPush ||
                              events[i].kind == EventKind::kPull ||
                              events[i].kind == EventKind::kCopyToDevice;
        EXPECT_EQ(events[i].bytes, transfer ? 61706 * 4 : 0) << EventKindName(events[i].kind);
      }
    }
  }
}

// Overlapping, a step is its data, then compute interrupted by waits for
// parameters (none here: a local store's pulls are in before the next
// forward), and the last step of the epoch waits for its pulls.
TEST(TrainerEventsTest, OverlappingStepsAreDataThenComputeAndTheEpochEndsWaiting) {
  constexpr int64_t kSteps = 3;
  const ObservedRun run = RunObserved(1, kSteps, /*overlap=*/true);
  std::map<int64_t, std::vector<TimedEvent>> by_step;
  for (const auto& r : run.records) {
    if (r.event.lane == kTrainerLane) by_step[r.event.step].push_back(r.event);
  }
  ASSERT_EQ(by_step.size(), static_cast<size_t>(kSteps));
  for (const auto& [step, events] : by_step) {
    ASSERT_GE(events.size(), 2u);
    EXPECT_EQ(events[0].kind, EventKind::kData);
    EXPECT_EQ(events[1].kind, EventKind::kCompute);
    for (size_t i = 1; i < events.size(); ++i) {
      EXPECT_TRUE(events[i].kind == EventKind::kCompute || events[i].kind == EventKind::kWait)
          << EventKindName(events[i].kind);
    }
    const bool last = step == kSteps - 1;
    EXPECT_EQ(events.back().kind, last ? EventKind::kWait : EventKind::kCompute) << step;
  }
  EXPECT_EQ(run.report.split.push, 0);
  EXPECT_EQ(run.report.split.pull, 0);
  EXPECT_GT(run.report.split.wait, 0);
}

// Replaying, a step takes the measured pass's time without computing, and
// still pushes a real gradient of the model's size, layer by layer.
TEST(TrainerTest, ReplayedComputeTakesTheMeasuredTimeAndPushesRealGradients) {
  const data::Dataset data = SyntheticDataset(512);
  for (bool overlap : {true, false}) {
    SCOPED_TRACE(overlap ? "overlap" : "no overlap");
    CpuDevice device(0, 1);
    auto store = LocalParameterStore::Create(MomentumSgd());
    ASSERT_TRUE(store.ok());
    RecordingObserver observer;
    TrainerOptions options;
    options.batch_size = 64;
    options.epochs = 1;
    options.max_steps = 4;
    options.evaluate = false;
    options.overlap = overlap;
    options.replay_compute = true;
    options.replay_calibration_steps = 3;
    options.observer = &observer;
    model::ModelConfig model;
    model.name = "lenet";
    auto trainer = Trainer::Create(options, model, {&device}, store->get(), &data, nullptr);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    const ComputeProfile* profile = (*trainer)->replay_profile();
    ASSERT_NE(profile, nullptr);
    EXPECT_EQ(profile->passes, 3);
    EXPECT_GT(profile->step_ns(), 0);
    // LeNet's five layers with parameters, each needed and each ready; its
    // three Linear layers hand their gradients over early too.
    int needs = 0, readies = 0, early = 0;
    for (const auto& p : profile->points) {
      needs += p.kind == ComputeProfile::Point::kNeedParameters;
      early += p.kind == ComputeProfile::Point::kGradientsEarly;
      readies += p.kind == ComputeProfile::Point::kGradientsReady;
    }
    EXPECT_EQ(needs, 5);
    EXPECT_EQ(readies, 5);
    EXPECT_EQ(early, 3);
    const std::vector<float> before = *(*trainer)->model().flat_parameters().ToVector();
    auto report = (*trainer)->Run();
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_EQ(report->compute, "replay");
    EXPECT_DOUBLE_EQ(report->replay_step_seconds, profile->step_ns() / 1e9);
    EXPECT_EQ(report->steps, 4);
    // No layer ran in the steps: only the calibration's passes (step -1).
    for (const auto& r : observer.records()) {
      if (r.event.kind == EventKind::kForward) EXPECT_EQ(r.event.step, -1);
    }
    // Every step slept at least the pass's time.
    EXPECT_GE(report->split.compute, 4 * profile->step_ns() / 1e9 * 0.99);
    EXPECT_NE(*(*trainer)->model().flat_parameters().ToVector(), before);
  }
  CpuDevice a(0, 1), b(1, 1);
  auto store = LocalParameterStore::Create(MomentumSgd());
  TrainerOptions options;
  options.replay_compute = true;
  model::ModelConfig model;
  EXPECT_EQ(Trainer::Create(options, model, {&a, &b}, store->get(), &data, nullptr)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// An emulated slower host sleeps on the trainer's clock: here one that
// records each sleep and jumps over it, so the test sleeps not at all.
// Without overlap each step's compute phase is the pass plus one sleep of
// (slowdown - 1) x the pass.
TEST(TrainerTest, ASlowdownSleepsOnTheTrainersClockAfterEachPass) {
  constexpr int64_t kTickNs = 1000;
  constexpr int64_t kSteps = 3;
  const data::Dataset data = SyntheticDataset(256);
  CpuDevice device(0, 1);
  auto store = LocalParameterStore::Create(MomentumSgd());
  ASSERT_TRUE(store.ok());
  testing::JumpingClock clock(kTickNs);
  RecordingObserver observer;
  TrainerOptions options;
  options.batch_size = 32;
  options.epochs = 1;
  options.max_steps = kSteps;
  options.evaluate = false;
  options.overlap = false;
  options.slowdown = 3;
  options.observer = &observer;
  options.clock = &clock;
  model::ModelConfig model;
  model.name = "lenet";
  auto trainer = Trainer::Create(options, model, {&device}, store->get(), &data, nullptr);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  auto report = (*trainer)->Run();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->compute, "real");
  const std::vector<int64_t> sleeps = clock.sleeps_ns();
  ASSERT_EQ(sleeps.size(), static_cast<size_t>(kSteps));
  std::vector<int64_t> compute_ns;
  for (const auto& r : observer.records()) {
    if (r.event.lane == kTrainerLane && r.event.kind == EventKind::kCompute) {
      compute_ns.push_back(r.event.end_ns - r.event.start_ns);
    }
  }
  ASSERT_EQ(compute_ns.size(), static_cast<size_t>(kSteps));
  for (int64_t step = 0; step < kSteps; ++step) {
    // The phase: the pass, then twice the pass asleep (give or take the
    // few clock readings around them, a tick each).
    EXPECT_GT(sleeps[step], 0) << step;
    EXPECT_NEAR(compute_ns[step], 1.5 * sleeps[step], 5 * kTickNs) << step;
  }
}

TEST(TrainerEventsTest, EveryDeviceReportsItsComputeOnItsOwnStableLane) {
  for (int d : {1, 3}) {
    SCOPED_TRACE(absl::StrCat(d, " devices"));
    constexpr int64_t kSteps = 4;
    const ObservedRun run = RunObserved(d, kSteps);
    std::map<int64_t, TimedEvent> trainer_compute;  // by step
    for (const auto& r : run.records) {
      if (r.event.lane == kTrainerLane && r.event.kind == EventKind::kCompute) {
        trainer_compute[r.event.step] = r.event;
      }
    }
    // lane -> the thread its events came from; step -> lanes seen.
    std::map<int32_t, std::thread::id> lane_thread;
    std::map<int64_t, std::vector<int32_t>> lanes_by_step;
    for (const auto& r : run.records) {
      if (r.event.lane == kTrainerLane || r.event.kind != EventKind::kCompute) continue;
      lanes_by_step[r.event.step].push_back(r.event.lane);
      auto [it, inserted] = lane_thread.emplace(r.event.lane, r.thread);
      if (!inserted) {
        EXPECT_EQ(it->second, r.thread) << LaneName(r.event.lane) << " moved";
      }
      const TimedEvent& outer = trainer_compute[r.event.step];
      EXPECT_GE(r.event.start_ns, outer.start_ns);
      EXPECT_LE(r.event.end_ns, outer.end_ns);
    }
    ASSERT_EQ(lanes_by_step.size(), static_cast<size_t>(kSteps));
    for (auto& [step, lanes] : lanes_by_step) {
      std::sort(lanes.begin(), lanes.end());
      std::vector<int32_t> want;
      for (int i = 0; i < d; ++i) want.push_back(DeviceLane(i));
      EXPECT_EQ(lanes, want) << "step " << step;
    }
    if (d == 1) {
      EXPECT_EQ(lane_thread[DeviceLane(0)], run.trainer_thread) << "one device runs inline";
    } else {
      for (const auto& [lane, thread] : lane_thread) {
        EXPECT_NE(thread, run.trainer_thread) << LaneName(lane);
      }
    }
  }
}

TEST(TrainerEventsTest, EveryLayerReportsItsPassesOnItsDevicesLane) {
  for (int d : {1, 2}) {
    SCOPED_TRACE(absl::StrCat(d, " devices"));
    constexpr int64_t kSteps = 2;
    const ObservedRun run = RunObserved(d, kSteps);
    // (step, lane) -> names in order, per pass; and the device's compute span.
    std::map<std::pair<int64_t, int32_t>, std::vector<std::string>> forward, backward;
    std::map<std::pair<int64_t, int32_t>, TimedEvent> compute;
    for (const auto& r : run.records) {
      const auto key = std::make_pair(r.event.step, r.event.lane);
      if (r.event.kind == EventKind::kForward) forward[key].push_back(r.name);
      if (r.event.kind == EventKind::kBackward) backward[key].push_back(r.name);
      if (r.event.kind == EventKind::kCompute && r.event.lane != kTrainerLane) {
        compute[key] = r.event;
      }
    }
    for (const auto& r : run.records) {
      if (r.event.kind != EventKind::kForward && r.event.kind != EventKind::kBackward) continue;
      const TimedEvent& outer = compute[std::make_pair(r.event.step, r.event.lane)];
      EXPECT_GE(r.event.start_ns, outer.start_ns) << r.name;
      EXPECT_LE(r.event.end_ns, outer.end_ns) << r.name;
    }
    // LeNet's top-level layers: the fused conv blocks, a flatten, three linear
    // layers with their activations between.
    const std::vector<std::string> named = {"conv1", "conv2", "fc1", "fc2", "fc3"};
    ASSERT_EQ(forward.size(), static_cast<size_t>(kSteps * d));
    for (int64_t step = 0; step < kSteps; ++step) {
      for (int i = 0; i < d; ++i) {
        SCOPED_TRACE(absl::StrCat("step ", step, ", device ", i));
        const auto key = std::make_pair(step, DeviceLane(i));
        const std::vector<std::string>& f = forward[key];
        ASSERT_EQ(f.size(), 8u);
        std::vector<std::string> f_named;
        for (const std::string& n : f) {
          if (std::find(named.begin(), named.end(), n) != named.end()) f_named.push_back(n);
        }
        EXPECT_EQ(f_named, named);
        EXPECT_EQ(f[2], "Flatten");
        std::vector<std::string> reversed(f.rbegin(), f.rend());
        EXPECT_EQ(backward[key], reversed) << "backward visits the layers in reverse";
      }
    }
  }
}

TEST(TrainerEventsTest, ANullClockIsRejected) {
  const data::Dataset data = SyntheticDataset(64);
  CpuDevice device(0, 1);
  auto store = LocalParameterStore::Create(MomentumSgd());
  TrainerOptions options;
  options.clock = nullptr;
  EXPECT_EQ(Trainer::Create(options, model::ModelConfig(), {&device}, store->get(), &data, nullptr)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps::worker
