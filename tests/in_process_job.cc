#include "tests/in_process_job.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/cpu_device.h"
#include "gtest/gtest.h"
#include "server/in_process_server.h"
#include "server/parameter_server_testing.h"
#include "worker/remote_parameter_store.h"

namespace ps::testing {

worker::TrainerOptions JobTrainerOptions() {
  worker::TrainerOptions options;
  options.batch_size = 30;
  options.epochs = 100;
  options.seed = 3;
  options.evaluate = false;
  return options;
}

worker::model::ModelConfig JobModel() {
  worker::model::ModelConfig model;
  model.name = "mlp";
  model.mlp_hidden = {48, 24};
  return model;
}

JobOutcome RunInProcessJob(const InProcessJob& job, const worker::data::Dataset& data) {
  JobOutcome out;
  auto server = server::InProcessServer::Start(job.server);
  if (!server.ok()) {
    ADD_FAILURE() << server.status();
    return out;
  }
  const int workers = job.server.num_workers;
  out.workers.resize(workers);
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      CpuDevice device(0, 1);
      worker::TrainerOptions options = job.trainer;
      options.max_steps = job.steps;
      if (job.configure) job.configure(w, &options);
      worker::RemoteStoreOptions store_options;
      store_options.server_address = (*server)->address();
      store_options.worker_id = absl::StrCat("worker-", w);
      store_options.rank = w;
      store_options.steps_per_epoch = (data.size() + options.batch_size - 1) / options.batch_size;
      auto store = worker::RemoteParameterStore::Create(store_options);
      ASSERT_TRUE(store.ok()) << store.status();
      auto trainer =
          worker::Trainer::Create(options, job.model, {&device}, store->get(), &data, nullptr);
      ASSERT_TRUE(trainer.ok()) << trainer.status();
      WorkerOutcome& mine = out.workers[w];
      mine.registered_loss_scale = (*trainer)->registration().loss_scale;
      auto report = (*trainer)->Run();
      ASSERT_TRUE(report.ok()) << report.status();
      mine.report = *report;
      mine.staleness = (*store)->staleness_histogram();
      mine.overflow_steps = (*trainer)->overflow_steps();
      mine.params = *(*trainer)->model().flat_parameters().ToVector();
    });
  }
  for (std::thread& t : threads) t.join();
  out.server_version = (*server)->domain().version();
  out.loss_scale = (*server)->domain().loss_scale();
  out.server_params.resize((*server)->domain().num_parameters());
  EXPECT_TRUE(
      server::Pull((*server)->domain(), 0, absl::InfiniteFuture(), absl::MakeSpan(out.server_params)).ok());
  return out;
}

}  // namespace ps::testing
