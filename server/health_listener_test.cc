#include "server/health_listener.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "proto/health.grpc.pb.h"

namespace ps::server {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

grpc::Status Check(int port, const std::string& service, HealthCheckResponse* response) {
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                     grpc::InsecureChannelCredentials());
  std::unique_ptr<Health::Stub> stub = Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  HealthCheckRequest request;
  request.set_service(service);
  return stub->Check(&context, request, response);
}

TEST(HealthListenerTest, AnswersInPlaintextWhatItIsTold) {
  absl::StatusOr<std::unique_ptr<HealthListener>> listener = HealthListener::Start("127.0.0.1:0");
  ASSERT_TRUE(listener.ok()) << listener.status();
  const int port = (*listener)->port();
  ASSERT_GT(port, 0);
  HealthCheckResponse response;
  ASSERT_TRUE(Check(port, "", &response).ok());
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING) << "before the job's port serves";
  (*listener)->SetServing(true);
  ASSERT_TRUE(Check(port, "", &response).ok());
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);
  (*listener)->SetServing(false);
  ASSERT_TRUE(Check(port, "", &response).ok());
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING) << "while the job shuts down";
}

// Nothing but the health service: the parameter server's methods are not
// reachable in plaintext through this port.
TEST(HealthListenerTest, ServesNoOtherMethod) {
  absl::StatusOr<std::unique_ptr<HealthListener>> listener = HealthListener::Start("127.0.0.1:0");
  ASSERT_TRUE(listener.ok()) << listener.status();
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", (*listener)->port()),
                                     grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::ByteBuffer request;
  grpc::ByteBuffer reply;
  grpc::Status status;
  grpc::CompletionQueue queue;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> call =
      stub.PrepareUnaryCall(&context, "/ps.proto.ParameterServer/Register", request, &queue);
  call->StartCall();
  call->Finish(&reply, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  ASSERT_TRUE(queue.Next(&tag, &ok));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED) << status.error_message();
  queue.Shutdown();
  while (queue.Next(&tag, &ok)) {
  }
}

TEST(HealthListenerTest, NamesAnAddressItCannotListenOn) {
  absl::StatusOr<std::unique_ptr<HealthListener>> first = HealthListener::Start("127.0.0.1:0");
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string taken = absl::StrCat("127.0.0.1:", (*first)->port());
  absl::StatusOr<std::unique_ptr<HealthListener>> second = HealthListener::Start(taken);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find(taken), std::string::npos) << second.status();
}

}  // namespace
}  // namespace ps::server
