// CheckpointDirectory: the layout of one server's --checkpoint_dir, complete
// steps (a manifest written last), the fallback to the previous complete
// checkpoint, keep-K pruning, and a failed fsync.
#include "server/checkpoint_directory.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/tests/checkpoint_test_util.h"

namespace depot {
namespace {

using ::depot::testing::CheckpointTestConfig;
using ::depot::testing::ExpectSameCheckpoint;
using ::depot::testing::RandomCheckpoint;
using ::depot::testing::ReadFileBytes;
using ::depot::testing::TempDir;
using ::depot::testing::WriteFileBytes;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

namespace fs = std::filesystem;

constexpr uint32_t kServer = 1;

class CheckpointDirectoryTest : public ::testing::Test {
 protected:
  std::unique_ptr<CheckpointDirectory> Open(
      FileSyncFn sync = SystemFileSync()) {
    absl::StatusOr<std::unique_ptr<CheckpointDirectory>> dir =
        CheckpointDirectory::Open(temp_.path() + "/ckpt", std::move(sync));
    EXPECT_TRUE(dir.ok()) << dir.status();
    return dir.ok() ? *std::move(dir) : nullptr;
  }

  static ShardCheckpoint At(uint64_t step) {
    return RandomCheckpoint(CheckpointTestConfig(), kServer, step,
                            static_cast<uint32_t>(step));
  }

  static void Write(CheckpointDirectory& dir, const ShardCheckpoint& c) {
    absl::StatusOr<uint64_t> bytes = dir.Write(c);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_GT(*bytes, 0u);
  }

  std::string ShardFile(const CheckpointDirectory& dir, uint64_t step) const {
    return dir.StepDirectory(JobKey{"", "ckpt-job"}, step) +
           "/shard-1-of-2.ckpt";
  }
  std::string ManifestFile(const CheckpointDirectory& dir,
                           uint64_t step) const {
    return dir.StepDirectory(JobKey{"", "ckpt-job"}, step) + "/manifest-1-of-2";
  }

  TempDir temp_;
};

TEST_F(CheckpointDirectoryTest, WrittenCheckpointLoadsBack) {
  auto dir = Open();
  const ShardCheckpoint checkpoint = At(10);
  Write(*dir, checkpoint);
  EXPECT_TRUE(fs::exists(ShardFile(*dir, 10)));
  EXPECT_TRUE(fs::exists(ManifestFile(*dir, 10)));
  EXPECT_THAT(dir->Jobs(), ElementsAre(JobKey{"", "ckpt-job"}));
  EXPECT_THAT(dir->CompleteSteps(JobKey{"", "ckpt-job"}), ElementsAre(10u));
  absl::StatusOr<ShardCheckpoint> loaded =
      dir->Load(JobKey{"", "ckpt-job"}, 10);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectSameCheckpoint(*loaded, checkpoint);
}

// Checkpoint called again at a step that has a complete checkpoint, and the
// second write abandoned half way (a shutdown's gate, an error): the step
// stays complete and loads.
TEST_F(CheckpointDirectoryTest, AbandonedRewriteOfAStepLeavesItComplete) {
  auto dir = Open();
  const ShardCheckpoint checkpoint = At(10);
  Write(*dir, checkpoint);
  uint64_t passed = 0;
  absl::StatusOr<uint64_t> again =
      dir->Write(checkpoint, [&](uint64_t bytes) -> absl::Status {
        passed += bytes;
        if (passed > 64) return absl::UnavailableError("shutting down");
        return absl::OkStatus();
      });
  ASSERT_FALSE(again.ok());
  EXPECT_THAT(dir->CompleteSteps(JobKey{"", "ckpt-job"}), ElementsAre(10u));
  absl::StatusOr<ShardCheckpoint> loaded =
      dir->Load(JobKey{"", "ckpt-job"}, 10);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 10u);
  // And a rewrite that finishes leaves it complete too.
  Write(*dir, checkpoint);
  EXPECT_THAT(dir->CompleteSteps(JobKey{"", "ckpt-job"}), ElementsAre(10u));
}

TEST_F(CheckpointDirectoryTest, NoTemporaryFilesAreLeft) {
  auto dir = Open();
  Write(*dir, At(10));
  std::vector<std::string> names;
  for (const auto& entry :
       fs::directory_iterator(dir->StepDirectory(JobKey{"", "ckpt-job"}, 10))) {
    names.push_back(entry.path().filename());
  }
  std::sort(names.begin(), names.end());
  EXPECT_THAT(names, ElementsAre("manifest-1-of-2", "shard-1-of-2.ckpt"));
}

TEST_F(CheckpointDirectoryTest, StepWithoutManifestIsIncomplete) {
  auto dir = Open();
  Write(*dir, At(10));
  Write(*dir, At(20));
  fs::remove(ManifestFile(*dir, 20));  // a crash before the manifest
  EXPECT_THAT(dir->CompleteSteps(JobKey{"", "ckpt-job"}), ElementsAre(10u));
  EXPECT_EQ(dir->Load(JobKey{"", "ckpt-job"}, 20).status().code(),
            absl::StatusCode::kNotFound);
  absl::StatusOr<ShardCheckpoint> newest = dir->LoadNewest(
      JobKey{"", "ckpt-job"}, [](uint64_t, const absl::Status&) {
        ADD_FAILURE() << "no complete step should be skipped";
      });
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(newest->step, 10u);
}

// The newest checkpoint damaged in each of three ways: the newest complete
// one that verifies is used, and the damaged one is reported as DATA_LOSS
// naming its file.
TEST_F(CheckpointDirectoryTest, DamagedNewestFallsBackToPreviousComplete) {
  struct Damage {
    const char* what;
    std::function<void(const std::string& shard_file)> apply;
  };
  const std::vector<Damage> damages = {
      {"bit flip",
       [](const std::string& file) {
         std::string bytes = ReadFileBytes(file);
         bytes[bytes.size() / 2] ^= 0x20;
         WriteFileBytes(file, bytes);
       }},
      {"truncation",
       [](const std::string& file) {
         std::string bytes = ReadFileBytes(file);
         WriteFileBytes(file, bytes.substr(0, bytes.size() - 100));
       }},
      {"missing shard file", [](const std::string& file) { fs::remove(file); }},
  };
  for (const Damage& damage : damages) {
    SCOPED_TRACE(damage.what);
    TempDir temp;
    auto dir = CheckpointDirectory::Open(temp.path() + "/ckpt").value();
    const ShardCheckpoint older = At(10);
    Write(*dir, older);
    Write(*dir, At(20));
    damage.apply(ShardFile(*dir, 20));

    std::vector<std::pair<uint64_t, absl::Status>> skipped;
    absl::StatusOr<ShardCheckpoint> newest = dir->LoadNewest(
        JobKey{"", "ckpt-job"}, [&](uint64_t step, const absl::Status& why) {
          skipped.emplace_back(step, why);
        });
    ASSERT_TRUE(newest.ok()) << newest.status();
    ExpectSameCheckpoint(*newest, older);
    ASSERT_EQ(skipped.size(), 1u);
    EXPECT_EQ(skipped[0].first, 20u);
    EXPECT_EQ(skipped[0].second.code(), absl::StatusCode::kDataLoss)
        << skipped[0].second;
    EXPECT_THAT(skipped[0].second.message(), HasSubstr(ShardFile(*dir, 20)));
  }
}

TEST_F(CheckpointDirectoryTest, DamagedManifestFallsBackToPreviousComplete) {
  auto dir = Open();
  Write(*dir, At(10));
  Write(*dir, At(20));
  std::string manifest = ReadFileBytes(ManifestFile(*dir, 20));
  manifest[manifest.size() - 3] ^= 0x01;
  WriteFileBytes(ManifestFile(*dir, 20), manifest);
  absl::Status why;
  absl::StatusOr<ShardCheckpoint> newest =
      dir->LoadNewest(JobKey{"", "ckpt-job"},
                      [&](uint64_t, const absl::Status& s) { why = s; });
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(newest->step, 10u);
  EXPECT_EQ(why.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(why.message(), HasSubstr("manifest"));
}

TEST_F(CheckpointDirectoryTest, NothingLoadableIsNotFound) {
  auto dir = Open();
  Write(*dir, At(10));
  fs::remove(ShardFile(*dir, 10));
  int skipped = 0;
  EXPECT_EQ(dir->LoadNewest(JobKey{"", "ckpt-job"},
                            [&](uint64_t, const absl::Status&) { ++skipped; })
                .status()
                .code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(skipped, 1);
  EXPECT_EQ(
      dir->LoadNewest(JobKey{"", "never-written"}, nullptr).status().code(),
      absl::StatusCode::kNotFound);
}

TEST_F(CheckpointDirectoryTest, PruneKeepsTheLastKCompleteSteps) {
  auto dir = Open();
  for (uint64_t step = 5; step <= 30; step += 5) Write(*dir, At(step));
  // An incomplete leftover among them, and one newer than all.
  fs::remove(ManifestFile(*dir, 25));
  fs::create_directories(dir->StepDirectory(JobKey{"", "ckpt-job"}, 35));
  WriteFileBytes(
      dir->StepDirectory(JobKey{"", "ckpt-job"}, 35) + "/shard-1-of-2.ckpt",
      "partial");

  ASSERT_TRUE(dir->Prune(JobKey{"", "ckpt-job"}, 3).ok());
  EXPECT_THAT(dir->CompleteSteps(JobKey{"", "ckpt-job"}),
              ElementsAre(30u, 20u, 15u));
  EXPECT_FALSE(fs::exists(dir->StepDirectory(JobKey{"", "ckpt-job"}, 35)));
  EXPECT_FALSE(fs::exists(dir->StepDirectory(JobKey{"", "ckpt-job"}, 25)));
  EXPECT_FALSE(fs::exists(dir->StepDirectory(JobKey{"", "ckpt-job"}, 10)));
  EXPECT_FALSE(fs::exists(dir->StepDirectory(JobKey{"", "ckpt-job"}, 5)));
  for (uint64_t step : {15u, 20u, 30u}) {
    EXPECT_TRUE(dir->Load(JobKey{"", "ckpt-job"}, step).ok()) << step;
  }
  ASSERT_TRUE(dir->Prune(JobKey{"", "ckpt-job"}, 1).ok());
  EXPECT_THAT(dir->CompleteSteps(JobKey{"", "ckpt-job"}), ElementsAre(30u));
}

// fsync(2) that fails with EIO, once, for the first file or directory whose
// path matches `target` (a regular expression over /proc/self/fd's link), and
// counts the calls for matching paths: a failed file must not be fsynced
// again.
struct FailingSync {
  explicit FailingSync(std::string target) : target(std::move(target)) {}
  int operator()(int fd) {
    const std::string path =
        fs::read_symlink("/proc/self/fd/" + std::to_string(fd)).string();
    if (std::regex_search(path, target)) {
      ++matching_calls;
      if (!failed) {
        failed = true;
        failed_path = path;
        errno = EIO;
        return -1;
      }
    }
    return ::fsync(fd);
  }
  std::regex target;
  bool failed = false;
  std::string failed_path;
  int matching_calls = 0;
};

TEST_F(CheckpointDirectoryTest, FailedFsyncFailsTheCheckpointAndIsNotRetried) {
  auto sync = std::make_shared<FailingSync>("shard-1-of-2\\.ckpt\\.tmp-");
  auto dir = Open([sync](int fd) { return (*sync)(fd); });
  absl::StatusOr<uint64_t> written = dir->Write(At(10));
  ASSERT_FALSE(written.ok());
  EXPECT_EQ(written.status().code(), absl::StatusCode::kUnavailable)
      << written.status();
  EXPECT_THAT(written.status().message(), HasSubstr("fsync failed"));
  EXPECT_THAT(written.status().message(), HasSubstr(sync->failed_path));
  EXPECT_EQ(sync->matching_calls, 1) << "nothing may retry a failed fsync";
  EXPECT_THAT(dir->CompleteSteps(JobKey{"", "ckpt-job"}), IsEmpty());
  EXPECT_FALSE(fs::exists(ShardFile(*dir, 10)));
  // No temporary file is left to be fsynced again later.
  EXPECT_TRUE(fs::is_empty(dir->StepDirectory(JobKey{"", "ckpt-job"}, 10)));

  // The next checkpoint writes new files and succeeds.
  Write(*dir, At(20));
  EXPECT_EQ(sync->matching_calls, 2);
  EXPECT_THAT(dir->CompleteSteps(JobKey{"", "ckpt-job"}), ElementsAre(20u));
}

TEST_F(CheckpointDirectoryTest, FailedManifestFsyncLeavesTheStepIncomplete) {
  auto sync = std::make_shared<FailingSync>("manifest-1-of-2\\.tmp-");
  auto dir = Open([sync](int fd) { return (*sync)(fd); });
  absl::StatusOr<uint64_t> written = dir->Write(At(10));
  ASSERT_FALSE(written.ok());
  EXPECT_THAT(written.status().message(), HasSubstr("manifest-1-of-2"));
  EXPECT_THAT(dir->CompleteSteps(JobKey{"", "ckpt-job"}), IsEmpty());
}

TEST_F(CheckpointDirectoryTest, FailedDirectoryFsyncLeavesTheStepIncomplete) {
  // The step directory's fsync after each rename: the first is the shard
  // file's, so the step never gets its manifest.
  auto sync = std::make_shared<FailingSync>("/step-0+10$");
  auto dir = Open([sync](int fd) { return (*sync)(fd); });
  absl::StatusOr<uint64_t> written = dir->Write(At(10));
  ASSERT_FALSE(written.ok());
  EXPECT_THAT(written.status().message(), HasSubstr("directory"));
  EXPECT_THAT(dir->CompleteSteps(JobKey{"", "ckpt-job"}), IsEmpty());
}

// A write stopped by its gate (a shutdown abandoning it) at any piece,
// including after the whole shard file: its error, no temporary file, no
// step that looks complete, and the older checkpoint still the newest.
TEST_F(CheckpointDirectoryTest, WriteStoppedByItsGateLeavesNothingComplete) {
  auto dir = Open();
  Write(*dir, At(10));
  int pieces = 0;
  ASSERT_TRUE(dir->Write(At(20),
                         [&](uint64_t) {
                           ++pieces;
                           return absl::OkStatus();
                         })
                  .ok());
  ASSERT_GT(pieces, 3);
  fs::remove_all(dir->StepDirectory(JobKey{"", "ckpt-job"}, 20));
  for (int stop_at : {1, 2, pieces / 2, pieces - 1, pieces}) {
    int calls = 0;
    absl::StatusOr<uint64_t> written =
        dir->Write(At(20), [&](uint64_t) -> absl::Status {
          if (++calls < stop_at) return absl::OkStatus();
          return absl::UnavailableError("abandoned");
        });
    ASSERT_FALSE(written.ok()) << "stopped at call " << stop_at;
    EXPECT_EQ(written.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(dir->CompleteSteps(JobKey{"", "ckpt-job"}), ElementsAre(10u));
    EXPECT_FALSE(fs::exists(ManifestFile(*dir, 20)));
    const std::string step_dir = dir->StepDirectory(JobKey{"", "ckpt-job"}, 20);
    if (fs::exists(step_dir)) {
      for (const auto& entry : fs::directory_iterator(step_dir)) {
        EXPECT_THAT(entry.path().filename().string(),
                    ::testing::Not(HasSubstr(".tmp-")))
            << "stopped at call " << stop_at;
      }
    }
  }
  absl::StatusOr<ShardCheckpoint> newest = dir->LoadNewest(
      JobKey{"", "ckpt-job"}, [](uint64_t, const absl::Status&) {});
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(newest->step, 10u);
}

TEST_F(CheckpointDirectoryTest, SecondOpenIsFailedPrecondition) {
  auto dir = Open();
  absl::StatusOr<std::unique_ptr<CheckpointDirectory>> second =
      CheckpointDirectory::Open(temp_.path() + "/ckpt");
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr("its own --checkpoint_dir"));
  dir.reset();  // the lock goes with it
  EXPECT_TRUE(CheckpointDirectory::Open(temp_.path() + "/ckpt").ok());
}

TEST_F(CheckpointDirectoryTest, MissingParentIsAnError) {
  EXPECT_FALSE(
      CheckpointDirectory::Open(temp_.path() + "/no/such/parent").ok());
}

TEST_F(CheckpointDirectoryTest, JobNamesWithAnyBytesRoundTrip) {
  auto dir = Open();
  const std::vector<std::string> names = {"a/b",   "..",     ".hidden",
                                          "x%41y", "sp ace", "llama-7b.v2"};
  for (const std::string& name : names) {
    ShardCheckpoint c = At(4);
    c.config.name = name;
    c.fingerprint = Fingerprint(c.config);
    Write(*dir, c);
    ASSERT_TRUE(dir->Load(JobKey{"", name}, 4).ok()) << name;
  }
  std::vector<std::string> sorted = names;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::string> found;
  for (const JobKey& job : dir->Jobs()) {
    EXPECT_EQ(job.tenant, "");
    found.push_back(job.name);
  }
  EXPECT_EQ(found, sorted);
  for (const auto& entry : fs::directory_iterator(dir->root())) {
    EXPECT_EQ(entry.path().parent_path(), fs::path(dir->root()));
  }
}

TEST_F(CheckpointDirectoryTest, RemoveJobRemovesEverything) {
  auto dir = Open();
  Write(*dir, At(10));
  Write(*dir, At(20));
  ASSERT_TRUE(dir->RemoveJob(JobKey{"", "ckpt-job"}).ok());
  EXPECT_FALSE(fs::exists(dir->JobDirectory(JobKey{"", "ckpt-job"})));
  EXPECT_THAT(dir->Jobs(), IsEmpty());
  EXPECT_TRUE(dir->RemoveJob(JobKey{"", "ckpt-job"}).ok());
}

TEST_F(CheckpointDirectoryTest, SetAsideHidesTheJobFromRestores) {
  auto dir = Open();
  absl::StatusOr<std::string> none = dir->SetAside(JobKey{"", "ckpt-job"});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, "");
  Write(*dir, At(10));
  absl::StatusOr<std::string> aside = dir->SetAside(JobKey{"", "ckpt-job"});
  ASSERT_TRUE(aside.ok()) << aside.status();
  EXPECT_THAT(*aside, HasSubstr("unrestored-ckpt-job-"));
  EXPECT_TRUE(fs::exists(*aside + "/step-00000000000000000010"));
  EXPECT_THAT(dir->Jobs(), IsEmpty());
}

// Job names are per tenant: three jobs "ckpt-job" (the implicit tenant's,
// alpha's and beta's) are three directories, and each is read, set aside and
// removed on its own.
TEST_F(CheckpointDirectoryTest, EachTenantsJobsLieInADirectoryOfItsOwn) {
  auto dir = Open();
  const JobKey plain{"", "ckpt-job"};
  const JobKey alpha{"alpha", "ckpt-job"};
  const JobKey beta{"beta", "ckpt-job"};
  for (const auto& [job, step] :
       {std::pair{plain, 10}, std::pair{alpha, 20}, std::pair{beta, 30}}) {
    ShardCheckpoint c = At(step);
    c.tenant = job.tenant;
    Write(*dir, c);
  }
  EXPECT_THAT(dir->Jobs(), ElementsAre(plain, alpha, beta));
  EXPECT_EQ(dir->JobDirectory(alpha),
            dir->root() + "/tenant-alpha/job-ckpt-job");
  EXPECT_EQ(dir->JobDirectory(plain), dir->root() + "/job-ckpt-job");
  EXPECT_THAT(dir->CompleteSteps(alpha), ElementsAre(20u));
  absl::StatusOr<ShardCheckpoint> loaded = dir->Load(beta, 30);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->tenant, "beta");
  EXPECT_EQ(dir->Load(beta, 20).status().code(), absl::StatusCode::kNotFound);

  absl::StatusOr<std::string> aside = dir->SetAside(alpha);
  ASSERT_TRUE(aside.ok()) << aside.status();
  EXPECT_THAT(*aside, HasSubstr("/tenant-alpha/unrestored-ckpt-job-"));
  ASSERT_TRUE(dir->RemoveJob(beta).ok());
  EXPECT_THAT(dir->Jobs(), ElementsAre(plain));
  EXPECT_THAT(dir->CompleteSteps(plain), ElementsAre(10u));
}

// A tenant name that is not a plain word (a client certificate's common name
// may hold any byte) is escaped like a job name.
TEST_F(CheckpointDirectoryTest, TenantNamesWithAnyBytesRoundTrip) {
  auto dir = Open();
  const JobKey job{"CN=a/b c", "ckpt-job"};
  ShardCheckpoint c = At(4);
  c.tenant = job.tenant;
  Write(*dir, c);
  EXPECT_THAT(dir->Jobs(), ElementsAre(job));
  EXPECT_EQ(fs::path(dir->JobDirectory(job)).parent_path().parent_path(),
            fs::path(dir->root()));
  EXPECT_TRUE(dir->Load(job, 4).ok());
}

// The tenants file of a server from before per-tenant names: the jobs it
// names move into their tenants' directories (and only those), the file
// goes, and doing it again changes nothing.
TEST_F(CheckpointDirectoryTest, AdoptsTheTenantsFileOfAnOlderServer) {
  auto dir = Open();
  for (const std::string name : {"alpha-run", "plain-run", "beta-run"}) {
    ShardCheckpoint c = At(10);
    c.config.name = name;
    c.fingerprint = Fingerprint(c.config);
    Write(*dir, c);
  }
  const std::string file = dir->root() + "/tenants";
  WriteFileBytes(file,
                 "# depot-server: the tenant of each job\n"
                 "alpha " +
                     absl::BytesToHexString("alpha-run") + "\n" + "beta " +
                     absl::BytesToHexString("beta-run") + "\n" + "beta " +
                     absl::BytesToHexString("deleted-run") + "\n");
  absl::StatusOr<int> moved = dir->AdoptTenantsFile();
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(*moved, 2);
  EXPECT_THAT(dir->Jobs(),
              ElementsAre(JobKey{"", "plain-run"}, JobKey{"alpha", "alpha-run"},
                          JobKey{"beta", "beta-run"}));
  absl::StatusOr<ShardCheckpoint> loaded =
      dir->Load(JobKey{"alpha", "alpha-run"}, 10);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->tenant, "alpha");
  EXPECT_FALSE(fs::exists(file));
  moved = dir->AdoptTenantsFile();
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(*moved, 0);
}

TEST_F(CheckpointDirectoryTest, ADamagedTenantsFileMovesNothingAndStays) {
  auto dir = Open();
  Write(*dir, At(10));
  const std::string file = dir->root() + "/tenants";
  WriteFileBytes(file, "alpha not-hex\n");
  absl::StatusOr<int> moved = dir->AdoptTenantsFile();
  EXPECT_EQ(moved.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(moved.status().message(), HasSubstr("line 1"));
  EXPECT_TRUE(fs::exists(file));
  EXPECT_THAT(dir->Jobs(), ElementsAre(JobKey{"", "ckpt-job"}));
}

}  // namespace
}  // namespace depot
