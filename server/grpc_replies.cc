#include "server/grpc_replies.h"

#include "server/stall_report.h"

namespace ps::server {

void FillRegisterReply(const ParameterServer& server, const ParameterServer::Registration& reg,
                       bool shrinks, proto::RegisterReply* reply) {
  reply->set_rank(reg.rank);
  reply->set_num_workers(reg.num_workers);
  reply->set_version(reg.version);
  reply->set_chunk_elements(reg.chunk_elements);
  reply->set_send_initial_parameters(reg.send_initial_parameters);
  reply->set_session(reg.session);
  for (int member : reg.members) reply->add_members(member);
  reply->set_shrinks(shrinks);
  reply->set_consistency(server.options().consistency->Name());
  reply->set_optimizer(server.options().optimizer.kind);
  reply->set_loss_scale(server.loss_scale().scale);
}

void FillHeartbeatReply(const ParameterServer::Progress& progress, const Clock* clock,
                        absl::Duration stall_report_after, absl::Duration liveness_timeout,
                        proto::HeartbeatReply* reply) {
  reply->set_version(progress.version);
  for (const ParameterServer::WorkerProgress& w : progress.workers) {
    reply->add_rank_steps(w.next_iteration);
  }
  if (clock == nullptr) return;
  const Stall stall =
      FindStall(progress, clock->NowNanos(), stall_report_after, liveness_timeout);
  reply->set_stall_report(stall.report);
  for (int rank : stall.missing) reply->add_missing_ranks(rank);
}

void DescribeJob(const ParameterServer& server, bool shrinks, proto::DescribeReply* reply) {
  const ParameterServer::Progress progress = server.progress();
  reply->set_num_workers(server.options().num_workers);
  int registered = 0;
  for (const ParameterServer::WorkerProgress& w : progress.workers) registered += !w.id.empty();
  reply->set_registered(registered);
  reply->set_version(progress.version);
  reply->set_initialized(progress.initialized);
  for (const ParamSpec& spec : server.signature()) {
    proto::TensorSpec* t = reply->add_signature();
    t->set_name(spec.name);
    t->set_dtype(proto::DTYPE_F32);
    for (int64_t d : spec.shape) t->add_shape(d);
  }
  reply->set_steps_per_epoch(server.steps_per_epoch());
  reply->set_chunk_elements(server.options().chunk_elements);
  reply->set_shrinks(shrinks);
}

}  // namespace ps::server
