#include "server/registrant_identity.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

using ::testing::HasSubstr;

TEST(RegistrantIdentityTest, UnderMutualTlsTheCertificateMustNameTheWorker) {
  const PeerCertificateNames w0{{"w0"}, {"w0"}};
  absl::StatusOr<WorkerIdentity> vouched =
      RegistrantIdentity("w0", /*client_certificates=*/true, w0, "", absl::Seconds(10));
  ASSERT_TRUE(vouched.ok()) << vouched.status();
  EXPECT_TRUE(vouched->vouched);
  EXPECT_STREQ(IdentityKind(*vouched), "certificate");

  const PeerCertificateNames w1{{"w1"}, {"w1"}};
  absl::StatusOr<WorkerIdentity> refused =
      RegistrantIdentity("w0", true, w1, "a secret proves nothing here", absl::Seconds(10));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.status().message(), HasSubstr("'w0'"));
  EXPECT_THAT(refused.status().message(), HasSubstr("w1"));
  EXPECT_EQ(RegistrantIdentity("w0", true, PeerCertificateNames(), "", absl::Seconds(10))
                .status()
                .code(),
            absl::StatusCode::kPermissionDenied)
      << "no certificate names no one";
}

TEST(RegistrantIdentityTest, WithoutClientCertificatesOnlyTheSecretSpeaks) {
  const PeerCertificateNames ignored{{"w0"}, {"w0"}};
  absl::StatusOr<WorkerIdentity> proved =
      RegistrantIdentity("w0", false, ignored, "secret", absl::Seconds(7));
  ASSERT_TRUE(proved.ok()) << proved.status();
  EXPECT_FALSE(proved->vouched);
  EXPECT_EQ(proved->proof, "secret");
  EXPECT_EQ(proved->liveness_timeout, absl::Seconds(7));
  EXPECT_STREQ(IdentityKind(*proved), "proof");
  absl::StatusOr<WorkerIdentity> token = RegistrantIdentity("w0", false, ignored, "", absl::Seconds(7));
  ASSERT_TRUE(token.ok());
  EXPECT_STREQ(IdentityKind(*token), "token");
}

}  // namespace
}  // namespace ps::server
