#include "server/job_owners.h"

#include <cstdio>
#include <map>
#include <string>

#include "gtest/gtest.h"
#include "server/tenant_auth.h"

namespace depot {
namespace {

TEST(JobOwnersTest, AJobBelongsToTheTenantThatCreatedIt) {
  JobOwners owners;
  ASSERT_TRUE(owners.ClaimName("alpha", "run").ok());
  EXPECT_TRUE(owners.Established("alpha", "run", 1).ok());
  EXPECT_TRUE(owners.Owns("alpha", 1));
  EXPECT_FALSE(owners.Owns("beta", 1));
  EXPECT_FALSE(owners.Owns(kImplicitTenant, 1));
}

TEST(JobOwnersTest, AnUnknownJobIsTheImplicitTenants) {
  JobOwners owners;
  EXPECT_TRUE(owners.Owns(kImplicitTenant, 7));
  EXPECT_FALSE(owners.Owns("alpha", 7));
}

TEST(JobOwnersTest, ANameAnotherTenantHoldsIsRefused) {
  JobOwners owners;
  ASSERT_TRUE(owners.ClaimName("alpha", "run").ok());
  EXPECT_EQ(owners.ClaimName("beta", "run").code(),
            absl::StatusCode::kAlreadyExists);
  // Pending (not yet created) counts as held too.
  EXPECT_TRUE(owners.Established("alpha", "run", 1).ok());
  EXPECT_EQ(owners.ClaimName("beta", "run").code(),
            absl::StatusCode::kAlreadyExists);
  // The same tenant attaches.
  EXPECT_TRUE(owners.ClaimName("alpha", "run").ok());
}

TEST(JobOwnersTest, AFailedCreationReleasesTheName) {
  JobOwners owners;
  ASSERT_TRUE(owners.ClaimName("alpha", "run").ok());
  owners.Abandoned("run");
  EXPECT_TRUE(owners.ClaimName("beta", "run").ok());
}

TEST(JobOwnersTest, AFailedAttachKeepsTheNameOfAnExistingJob) {
  JobOwners owners;
  ASSERT_TRUE(owners.ClaimName("alpha", "run").ok());
  EXPECT_TRUE(owners.Established("alpha", "run", 1).ok());
  ASSERT_TRUE(owners.ClaimName("alpha", "run").ok());
  owners.Abandoned("run");  // e.g. another config: FAILED_PRECONDITION
  EXPECT_EQ(owners.ClaimName("beta", "run").code(),
            absl::StatusCode::kAlreadyExists);
}

TEST(JobOwnersTest, OneFailedClaimDoesNotReleaseAnotherPendingOne) {
  JobOwners owners;
  ASSERT_TRUE(owners.ClaimName("alpha", "run").ok());
  ASSERT_TRUE(owners.ClaimName("alpha", "run").ok());
  owners.Abandoned("run");
  EXPECT_EQ(owners.ClaimName("beta", "run").code(),
            absl::StatusCode::kAlreadyExists);
}

TEST(JobOwnersTest, DeletingFreesTheIdAndTheName) {
  JobOwners owners;
  ASSERT_TRUE(owners.ClaimName("alpha", "run").ok());
  EXPECT_TRUE(owners.Established("alpha", "run", 1).ok());
  EXPECT_TRUE(owners.Removed("run", 1).ok());
  EXPECT_FALSE(owners.Owns("alpha", 1));
  EXPECT_TRUE(owners.ClaimName("beta", "run").ok());
}

TEST(JobOwnersTest, RestoredJobsAndTheirNamesAreTheImplicitTenants) {
  JobOwners owners;
  EXPECT_TRUE(owners.AddRestored({{"old-run", 3}}).ok());
  EXPECT_TRUE(owners.Owns(kImplicitTenant, 3));
  EXPECT_FALSE(owners.Owns("alpha", 3));
  EXPECT_EQ(owners.ClaimName("alpha", "old-run").code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(owners.ClaimName(kImplicitTenant, "old-run").ok());
}

}  // namespace
}  // namespace depot

namespace depot {
namespace {

TEST(TenantsFileTest, RoundTripsAnyName) {
  const std::map<std::string, std::string> tenants = {
      {"plain", "alpha"}, {std::string("odd name\n\0/x", 13), "beta"}};
  absl::StatusOr<std::map<std::string, std::string>> decoded =
      DecodeTenantsFile(EncodeTenantsFile(tenants));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, tenants);
}

TEST(TenantsFileTest, ADamagedLineIsDataLoss) {
  EXPECT_EQ(DecodeTenantsFile("alpha 6a6\n").status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeTenantsFile("alpha\n").status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(TenantsFileTest, RestoredJobsGoBackToTheTenantsTheFileNames) {
  const std::string path =
      ::testing::TempDir() + "/depot-job-owners-test-tenants";
  {
    JobOwners owners(path);
    ASSERT_TRUE(owners.AddRestored({}).ok());
    ASSERT_TRUE(owners.ClaimName("alpha", "a-run").ok());
    ASSERT_TRUE(owners.Established("alpha", "a-run", 1).ok());
    ASSERT_TRUE(owners.ClaimName("beta", "b-run").ok());
    ASSERT_TRUE(owners.Established("beta", "b-run", 2).ok());
    ASSERT_TRUE(owners.ClaimName("beta", "gone").ok());
    ASSERT_TRUE(owners.Established("beta", "gone", 3).ok());
    ASSERT_TRUE(owners.Removed("gone", 3).ok());
  }
  // The restarted server restores the jobs under new ids.
  JobOwners restarted(path);
  ASSERT_TRUE(
      restarted.AddRestored({{"a-run", 7}, {"b-run", 8}, {"gone", 9}}).ok());
  EXPECT_TRUE(restarted.Owns("alpha", 7));
  EXPECT_TRUE(restarted.Owns("beta", 8));
  EXPECT_FALSE(restarted.Owns("alpha", 8));
  EXPECT_TRUE(restarted.Owns(kImplicitTenant, 9));
  EXPECT_EQ(restarted.ClaimName("alpha", "b-run").code(),
            absl::StatusCode::kAlreadyExists);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace depot
