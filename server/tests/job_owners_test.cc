#include "server/job_owners.h"

#include "gtest/gtest.h"
#include "server/tenant_auth.h"

namespace depot {
namespace {

TEST(JobOwnersTest, AJobBelongsToTheTenantThatCreatedIt) {
  JobOwners owners;
  ASSERT_TRUE(owners.ClaimName("alpha", "run").ok());
  owners.Established("alpha", "run", 1);
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
  owners.Established("alpha", "run", 1);
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
  owners.Established("alpha", "run", 1);
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
  owners.Established("alpha", "run", 1);
  owners.Removed("run", 1);
  EXPECT_FALSE(owners.Owns("alpha", 1));
  EXPECT_TRUE(owners.ClaimName("beta", "run").ok());
}

TEST(JobOwnersTest, RestoredJobsAndTheirNamesAreTheImplicitTenants) {
  JobOwners owners;
  owners.AddRestored("old-run", 3);
  EXPECT_TRUE(owners.Owns(kImplicitTenant, 3));
  EXPECT_FALSE(owners.Owns("alpha", 3));
  EXPECT_EQ(owners.ClaimName("alpha", "old-run").code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(owners.ClaimName(kImplicitTenant, "old-run").ok());
}

}  // namespace
}  // namespace depot
