#ifndef PS_SERVER_GRPC_REPLIES_H_
#define PS_SERVER_GRPC_REPLIES_H_

// The domain's answers as the wire's replies (proto/parameter_server.proto)
// where they need nothing of the call: what a registration, a heartbeat and
// Describe tell a worker of the job. The service (grpc_service.h) adds the
// call's own parts.

#include "absl/time/time.h"
#include "common/clock.h"
#include "proto/parameter_server.pb.h"
#include "server/parameter_server.h"

namespace ps::server {

// Register's reply for `reg`: rank, job size, version, chunking, session,
// members, and the job's rules (`shrinks`, consistency, optimizer, loss
// scale).
void FillRegisterReply(const ParameterServer& server, const ParameterServer::Registration& reg,
                       bool shrinks, proto::RegisterReply* reply);

// A heartbeat's view of the job: the version, each rank's next step and,
// with a clock, the stall report (server/stall_report.h) after
// `stall_report_after`, ranks silent past `liveness_timeout` named lost.
void FillHeartbeatReply(const ParameterServer::Progress& progress, const Clock* clock,
                        absl::Duration stall_report_after, absl::Duration liveness_timeout,
                        proto::HeartbeatReply* reply);

// Describe's reply: the job's size, registrations, version, signature,
// steps per epoch, chunking and `shrinks`.
void DescribeJob(const ParameterServer& server, bool shrinks, proto::DescribeReply* reply);

}  // namespace ps::server

#endif  // PS_SERVER_GRPC_REPLIES_H_
