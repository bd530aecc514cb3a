// The order in which contributions arrive must not change the result: a run
// driven through the raw protocol with the workers' whole steps sent from the
// last rank to the first, each with its chunks in reverse order, ends in
// bitwise the same state as the client library's run (ascending chunks, workers
// racing) and as the in-process reference. With W = 2 fp32 addition commutes,
// so the W = 3 case is the one that proves the server sums in rank order, not
// arrival order.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bitwise_compare.h"
#include "client_training.h"
#include "depot/shard_plan.h"
#include "gtest/gtest.h"
#include "raw_driver.h"
#include "reference_optimizer.h"
#include "training_data.h"
#include "two_servers.h"
#include "wire/wire.h"

namespace depot::testing {
namespace {

constexpr uint64_t kSeed = 7;
constexpr uint64_t kSteps = 5;

std::vector<v1::Chunk> Reversed(std::vector<v1::Chunk> chunks) {
  std::reverse(chunks.begin(), chunks.end());
  return chunks;
}

// One job on both servers, driven message by message in reverse order.
class ReversedRawRun {
 public:
  ReversedRawRun(const std::vector<std::string>& servers, JobConfig config)
      : config_(std::move(config)),
        layout_(*Layout::Create(config_.tensors, config_.alignment_elems)),
        plan_(*ShardPlan::Create(layout_.total_elems(), config_.num_servers,
                                 config_.chunk_elems)) {
    for (const std::string& address : servers) {
      stubs_.push_back(NewDepotStub(address));
    }
  }

  void CreateAndInit() {
    v1::JobSpec spec;
    JobConfigToProto(config_, &spec);
    const std::string weights =
        MakeInitialWeights(layout_, DType::kFloat32, kSeed);
    for (uint32_t s = 0; s < stubs_.size(); ++s) {
      v1::CreateJobResponse response;
      grpc::Status status = RawCreateJob(*stubs_[s], spec, s, &response);
      ASSERT_TRUE(status.ok()) << status.error_message();
      job_ids_.push_back(response.job_id());
      fingerprint_ = response.fingerprint();

      status = RawInitWeights(
          *stubs_[s], MakeInitHeader(job_ids_[s], fingerprint_, v1::DTYPE_FP32),
          Reversed(ShardChunks(s, weights)));
      ASSERT_TRUE(status.ok()) << status.error_message();
    }
  }

  // Every server gets the last rank's whole step first, then the others down to
  // rank 0; every rank but 0 sends its chunks in reverse order.
  void RunStep(uint64_t step) {
    const uint32_t workers = config_.num_workers;
    std::vector<std::string> grads;
    for (uint32_t rank = 0; rank < workers; ++rank) {
      grads.push_back(
          MakeGradients(layout_, DType::kFloat32, kSeed, step, rank));
    }
    for (uint32_t s = 0; s < stubs_.size(); ++s) {
      std::vector<StepStreamPlan> plans;
      for (uint32_t rank = workers; rank-- > 0;) {
        const v1::StepHeader header = MakeStepHeader(
            job_ids_[s], fingerprint_, step, rank, StepHyperParams(step));
        std::vector<v1::Chunk> chunks = ShardChunks(s, grads[rank]);
        plans.push_back(
            MakeStepPlan(header, rank == 0 ? chunks : Reversed(chunks)));
      }
      for (const StepStreamResult& result : RunStepStreams(*stubs_[s], plans)) {
        ASSERT_TRUE(result.status.ok())
            << "step " << step << " on server " << s << ": "
            << result.status.error_message();
        EXPECT_EQ(result.weights.size(), plan_.shard(s).num_chunks());
      }
    }
  }

  void PullMaster(std::vector<float>* master) {
    master->clear();
    for (uint32_t s = 0; s < stubs_.size(); ++s) {
      const ShardRange& shard = plan_.shard(s);
      std::string payload;
      grpc::Status status =
          RawPull(*stubs_[s],
                  MakePullRequest(job_ids_[s], fingerprint_, shard.begin,
                                  shard.end, v1::DTYPE_FP32),
                  &payload);
      ASSERT_TRUE(status.ok()) << status.error_message();
      ASSERT_EQ(payload.size(), shard.size() * sizeof(float));
      master->resize(shard.end);
      std::memcpy(master->data() + shard.begin, payload.data(), payload.size());
    }
  }

  void StateChecksums(std::vector<uint64_t>* checksums) {
    checksums->clear();
    for (uint32_t s = 0; s < stubs_.size(); ++s) {
      v1::JobStatus status;
      grpc::Status rpc = RawGetJob(*stubs_[s], job_ids_[s], true, &status);
      ASSERT_TRUE(rpc.ok()) << rpc.error_message();
      EXPECT_EQ(status.step(), kSteps);
      checksums->push_back(status.state_checksum());
    }
  }

 private:
  std::vector<v1::Chunk> ShardChunks(uint32_t server, const std::string& flat) {
    const ShardRange& shard = plan_.shard(server);
    return MakeChunks(plan_, shard.first_chunk, shard.end_chunk, flat.data(),
                      DType::kFloat32);
  }

  JobConfig config_;
  Layout layout_;
  ShardPlan plan_;
  std::vector<std::unique_ptr<v1::Depot::Stub>> stubs_;
  std::vector<uint64_t> job_ids_;
  uint64_t fingerprint_ = 0;
};

class ArrivalOrderTest : public TwoServers {
 protected:
  // Trains the same inputs twice, through the client and reversed through the
  // raw protocol, under two job names, and compares both with the reference.
  void CompareClientAndReversedRuns(uint32_t num_workers) {
    const JobConfig client_config = LargeJobConfig(
        "client-order", DType::kFloat32, DType::kFloat32, num_workers);
    absl::StatusOr<std::unique_ptr<ClientTraining>> training =
        ClientTraining::Open(Addresses(), client_config);
    ASSERT_TRUE(training.ok()) << training.status();
    absl::Status init = (*training)->InitWeights(kSeed, DType::kFloat32);
    ASSERT_TRUE(init.ok()) << init;
    for (const WorkerOutcome& outcome :
         (*training)->RunSteps(kSeed, 1, kSteps)) {
      ASSERT_TRUE(outcome.status.ok()) << outcome.status;
    }

    const JobConfig reversed_config = LargeJobConfig(
        "reversed-order", DType::kFloat32, DType::kFloat32, num_workers);
    ReversedRawRun reversed(Addresses(), reversed_config);
    ASSERT_NO_FATAL_FAILURE(reversed.CreateAndInit());
    for (uint64_t step = 1; step <= kSteps; ++step) {
      ASSERT_NO_FATAL_FAILURE(reversed.RunStep(step));
    }

    absl::StatusOr<std::vector<float>> client_master =
        (*training)->PullMaster();
    ASSERT_TRUE(client_master.ok()) << client_master.status();
    std::vector<float> reversed_master;
    ASSERT_NO_FATAL_FAILURE(reversed.PullMaster(&reversed_master));
    EXPECT_TRUE(BitwiseEqual(*client_master, reversed_master));
    EXPECT_TRUE(BitwiseEqual(
        TrainReference(reversed_config, DType::kFloat32, kSeed, kSteps)
            .master(),
        reversed_master));

    // The whole state, moments and step counters included, not just weights.
    absl::StatusOr<std::vector<uint64_t>> client_checksums =
        (*training)->StateChecksums();
    ASSERT_TRUE(client_checksums.ok()) << client_checksums.status();
    std::vector<uint64_t> reversed_checksums;
    ASSERT_NO_FATAL_FAILURE(reversed.StateChecksums(&reversed_checksums));
    EXPECT_EQ(*client_checksums, reversed_checksums);
  }
};

TEST_F(ArrivalOrderTest, TwoWorkersInReverseOrderGiveBitwiseIdenticalState) {
  CompareClientAndReversedRuns(2);
}

TEST_F(ArrivalOrderTest, ThreeWorkersInReverseOrderAreStillSummedInRankOrder) {
  CompareClientAndReversedRuns(3);
}

}  // namespace
}  // namespace depot::testing
