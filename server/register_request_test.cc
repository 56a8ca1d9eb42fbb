#include "server/register_request.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

proto::RegisterRequest Request() {
  proto::RegisterRequest request;
  request.set_worker_id("w0");
  proto::TensorSpec* w = request.add_signature();
  w->set_name("fc.weight");
  w->set_dtype(proto::DTYPE_F32);
  w->add_shape(10);
  w->add_shape(4);
  proto::TensorSpec* b = request.add_signature();
  b->set_name("fc.bias");
  b->set_dtype(proto::DTYPE_F32);
  b->add_shape(10);
  return request;
}

TEST(RegisterRequestTest, ReadsTheSignatureAndTheRequestedRank) {
  proto::RegisterRequest request = Request();
  auto args = ReadRegisterRequest(request);
  ASSERT_TRUE(args.ok()) << args.status();
  ASSERT_EQ(args->signature.size(), 2u);
  EXPECT_EQ(args->signature[0].name, "fc.weight");
  EXPECT_THAT(args->signature[0].shape, ElementsAre(10, 4));
  EXPECT_EQ(args->signature[1].dtype, DType::kF32);
  EXPECT_EQ(args->requested_rank, -1);
  request.set_requested_rank(3);
  EXPECT_EQ(ReadRegisterRequest(request)->requested_rank, 3);
}

TEST(RegisterRequestTest, ReadsTheJobRunUpToItsBound) {
  proto::RegisterRequest request = Request();
  EXPECT_EQ(ReadRegisterRequest(request)->job_run, "");
  request.set_job_run(std::string(kMaxJobRunBytes, 'a'));
  EXPECT_EQ(ReadRegisterRequest(request)->job_run, request.job_run());
  request.set_job_run(std::string(kMaxJobRunBytes + 1, 'a'));
  EXPECT_EQ(ReadRegisterRequest(request).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ReadRegisterRequest(request).status().message()), HasSubstr("job run"));
}

TEST(RegisterRequestTest, RefusesWhatTheWireMustNotCarryNamingIt) {
  auto refused = [](proto::RegisterRequest request) {
    return std::string(ReadRegisterRequest(request).status().message());
  };
  proto::RegisterRequest long_id = Request();
  long_id.set_worker_id(std::string(kMaxWorkerIdBytes + 1, 'x'));
  EXPECT_THAT(refused(long_id), HasSubstr("a worker id of 257 bytes; at most 256"));
  proto::RegisterRequest long_proof = Request();
  long_proof.set_identity_proof(std::string(kMaxIdentityProofBytes + 1, 'p'));
  EXPECT_THAT(refused(long_proof), HasSubstr("an identity proof of 1025 bytes; at most 1024"));
  proto::RegisterRequest long_name = Request();
  long_name.mutable_signature(1)->set_name(std::string(kMaxTensorNameBytes + 1, 'n'));
  EXPECT_THAT(refused(long_name), HasSubstr("parameter 1's name has 1025 bytes"));
  proto::RegisterRequest deep = Request();
  for (int d = 0; d < kMaxDimensions; ++d) deep.mutable_signature(0)->add_shape(1);
  EXPECT_THAT(refused(deep), HasSubstr("'fc.weight' has 66 dimensions; at most 64"));
  proto::RegisterRequest half = Request();
  half.mutable_signature(0)->set_dtype(proto::DTYPE_F16);
  EXPECT_THAT(refused(half), HasSubstr("only F32 parameters are supported"));
  proto::RegisterRequest negative = Request();
  negative.mutable_signature(1)->set_shape(0, -10);
  EXPECT_THAT(refused(negative), HasSubstr("'fc.bias' has a negative dimension"));
  proto::RegisterRequest rank = Request();
  rank.set_requested_rank(-2);
  EXPECT_THAT(refused(rank), HasSubstr("requested rank -2 is negative"));
}

}  // namespace
}  // namespace ps::server
