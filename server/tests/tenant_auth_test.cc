#include "server/tenant_auth.h"

#include <cctype>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace depot {
namespace {

using ::testing::HasSubstr;

// SHA-256("abc"), FIPS 180-2 appendix B.1.
constexpr char kAbcHash[] =
    "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

TEST(Sha256HexTest, MatchesTheStandardTestVector) {
  EXPECT_EQ(Sha256Hex("abc"), kAbcHash);
}

TEST(ParseTokenFileTest, ReadsTenantsAndHashesSkippingCommentsAndBlanks) {
  absl::StatusOr<std::vector<TokenEntry>> entries =
      ParseTokenFile(absl::StrCat("# tokens\n\n  alpha ", kAbcHash, "  \n",
                                  "beta.team-2\t", Sha256Hex("other"), "\n"));
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 2u);
  EXPECT_EQ((*entries)[0].tenant, "alpha");
  EXPECT_EQ((*entries)[0].hash[0], 0xba);
  EXPECT_EQ((*entries)[0].hash[31], 0xad);
  EXPECT_EQ((*entries)[1].tenant, "beta.team-2");
}

TEST(ParseTokenFileTest, UpperCaseHexIsTheSameHash) {
  std::string upper = kAbcHash;
  for (char& c : upper) c = static_cast<char>(std::toupper(c));
  absl::StatusOr<std::vector<TokenEntry>> entries =
      ParseTokenFile(absl::StrCat("alpha ", upper, "\n"));
  ASSERT_TRUE(entries.ok()) << entries.status();
  EXPECT_EQ((*entries)[0].hash[0], 0xba);
}

TEST(ParseTokenFileTest, NamesTheLineOfAMalformedEntry) {
  for (const std::string& bad :
       {std::string("alpha"), std::string("alpha 1234"),
        absl::StrCat("alpha ", kAbcHash, " extra"),
        absl::StrCat("al/pha ", kAbcHash),
        absl::StrCat(std::string(65, 'a'), " ", kAbcHash),
        absl::StrCat("alpha ", std::string(63, 'a'), "g")}) {
    SCOPED_TRACE(bad);
    absl::StatusOr<std::vector<TokenEntry>> entries =
        ParseTokenFile(absl::StrCat("# first\n", bad, "\n"));
    EXPECT_EQ(entries.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(entries.status().message(), HasSubstr("line 2:"));
  }
}

TEST(ParseTokenFileTest, RefusesATokenListedTwice) {
  absl::StatusOr<std::vector<TokenEntry>> entries = ParseTokenFile(
      absl::StrCat("alpha ", kAbcHash, "\nbeta ", kAbcHash, "\n"));
  EXPECT_EQ(entries.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(entries.status().message(), HasSubstr("twice"));
}

TEST(ParseTokenFileTest, RefusesAFileWithoutTokens) {
  EXPECT_EQ(ParseTokenFile("# nothing here\n\n").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TenantAuthTest, WithoutTokensOrCertificatesItIsOff) {
  absl::StatusOr<std::unique_ptr<TenantAuth>> auth =
      TenantAuth::Create("", /*client_certificates=*/false);
  ASSERT_TRUE(auth.ok());
  EXPECT_FALSE((*auth)->enabled());
}

TEST(TenantAuthTest, AMissingTokenFileIsNamed) {
  absl::StatusOr<std::unique_ptr<TenantAuth>> auth =
      TenantAuth::Create("/nonexistent/tokens", false);
  EXPECT_EQ(auth.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(auth.status().message(), HasSubstr("/nonexistent/tokens"));
}

}  // namespace
}  // namespace depot
