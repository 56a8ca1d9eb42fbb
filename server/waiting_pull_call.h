#ifndef PS_SERVER_WAITING_PULL_CALL_H_
#define PS_SERVER_WAITING_PULL_CALL_H_

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/grpc_status.h"
#include "server/waiting_pulls.h"

namespace ps::server::internal {

// A Pull or Wait call that waits for its chunks (server/waiting_pulls.h), on
// a reactor of its own so that its client's cancellation reaches it.
// Whoever takes it out of the WaitingPulls (an answering call, the deadline
// thread, OnCancel, Shutdown or FailJob) calls Finish, once; gRPC then
// calls OnDone, which deletes it.
class WaitingPullCall final : public grpc::ServerUnaryReactor, public WaitingPull {
 public:
  // `answer` frames the reply (the call's, valid until Finish) from the
  // chunks `ids` as they are then, or returns why it cannot; called once,
  // when the pull is answered (past its deadline: at once, with the error
  // the store gives then).
  using Answer = std::function<absl::Status(const std::vector<ChunkId>& ids)>;
  WaitingPullCall(std::shared_ptr<WaitingPulls> registry, int64_t version,
                  std::vector<ChunkId> ids, absl::Time deadline, Answer answer)
      : WaitingPull(version, std::move(ids), deadline),
        registry_(std::move(registry)),
        answer_(std::move(answer)) {}

  void AnswerNow() override { Finish(ToGrpcStatus(answer_(ids()))); }
  void Refuse(const absl::Status& status) override { Finish(ToGrpcStatus(status)); }
  void OnCancel() override {
    // Answered already when someone else took it; else nobody will hear the
    // answer, so it is dropped at once.
    if (registry_->Withdraw(this)) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the pull"));
    }
  }
  void OnDone() override { delete this; }

 private:
  const std::shared_ptr<WaitingPulls> registry_;
  const Answer answer_;
};

}  // namespace ps::server::internal

#endif  // PS_SERVER_WAITING_PULL_CALL_H_
