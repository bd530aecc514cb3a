#include "server/import_roots.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace depot {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class ImportRootsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = fs::temp_directory_path() / "depot-roots-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = fs::canonical(pattern).string();
    fs::create_directories(dir_ + "/shared/old-0");
    fs::create_directories(dir_ + "/shared/old-1");
    fs::create_directories(dir_ + "/elsewhere/secret");
    fs::create_directory_symlink(dir_ + "/elsewhere", dir_ + "/shared/link");
  }
  void TearDown() override { fs::remove_all(dir_); }

  ImportRoots Roots() {
    absl::StatusOr<ImportRoots> roots = ImportRoots::Create({dir_ + "/shared"});
    EXPECT_TRUE(roots.ok()) << roots.status();
    return roots.ok() ? *roots : ImportRoots();
  }

  std::string dir_;
};

TEST_F(ImportRootsTest, DirectoriesUnderARootResolveToTheirCanonicalPaths) {
  absl::StatusOr<std::vector<std::string>> dirs = Roots().Resolve(
      {dir_ + "/shared/old-0", dir_ + "/shared/./old-1/", dir_ + "/shared"});
  ASSERT_TRUE(dirs.ok()) << dirs.status();
  EXPECT_THAT(*dirs, ElementsAre(dir_ + "/shared/old-0", dir_ + "/shared/old-1",
                                 dir_ + "/shared"));
}

TEST_F(ImportRootsTest, DotDotOutOfTheRootIsRefused) {
  absl::StatusOr<std::vector<std::string>> dirs = Roots().Resolve(
      {dir_ + "/shared/old-0", dir_ + "/shared/../elsewhere/secret"});
  EXPECT_EQ(dirs.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(dirs.status().message(), HasSubstr("--import_roots"));
}

TEST_F(ImportRootsTest, ASymbolicLinkOutOfTheRootIsRefused) {
  absl::StatusOr<std::vector<std::string>> dirs =
      Roots().Resolve({dir_ + "/shared/link/secret"});
  EXPECT_EQ(dirs.status().code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(ImportRootsTest, APrefixThatIsNotAParentIsRefused) {
  fs::create_directory(dir_ + "/shared-other");
  absl::StatusOr<std::vector<std::string>> dirs =
      Roots().Resolve({dir_ + "/shared-other"});
  EXPECT_EQ(dirs.status().code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(ImportRootsTest, AMissingDirectoryLooksLikeOneOutsideTheRoots) {
  absl::StatusOr<std::vector<std::string>> missing =
      Roots().Resolve({dir_ + "/shared/nothing"});
  absl::StatusOr<std::vector<std::string>> outside = Roots().Resolve({"/etc"});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(outside.status().message(), HasSubstr("\"/etc\""));
}

TEST_F(ImportRootsTest, WithoutRootsEveryImportIsRefused) {
  absl::StatusOr<std::vector<std::string>> dirs =
      ImportRoots().Resolve({dir_ + "/shared/old-0"});
  EXPECT_EQ(dirs.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(dirs.status().message(), HasSubstr("--import_roots"));
}

TEST_F(ImportRootsTest, AMissingRootIsRefusedAtStartUp) {
  absl::StatusOr<ImportRoots> roots =
      ImportRoots::Create({dir_ + "/no-such-dir"});
  EXPECT_EQ(roots.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(roots.status().message(), HasSubstr("no-such-dir"));
}

}  // namespace
}  // namespace depot
