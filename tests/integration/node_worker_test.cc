// Node workers (docs/protocol.md, "Node workers"), driven with the raw stub
// against two real servers: a worker that is a node of G local ranks sends
// each chunk once, from the local rank NodePartition gives it, on that rank's
// own streams; the servers count one contribution per (node, chunk), so the
// result is bitwise that of one-process workers sending their node's summed
// gradient. A chunk from the wrong local rank, a header with a bad node shape
// and streams of one worker's step that disagree on the shape are rejected
// with their codes and change nothing.
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "depot/layout.h"
#include "depot/node_partition.h"
#include "depot/shard_plan.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "raw_driver.h"
#include "training_data.h"
#include "two_servers.h"
#include "wire/wire.h"

namespace depot::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

constexpr uint64_t kSeed = 31;
constexpr uint32_t kNodes = 2;       // W: the job's workers
constexpr uint32_t kLocalRanks = 2;  // G: GPUs per node
constexpr uint64_t kSteps = 3;

// Each node chooses its own buckets: node 0 of 4 chunks, node 1 one bucket
// larger than the model (a dozen chunks).
uint64_t BucketChunks(uint32_t node) { return node == 0 ? 4 : 16; }

// The weights one worker got back from a server in one step, by chunk.
using WeightsByChunk = std::map<uint64_t, std::string>;

// Two servers, each holding the shards of two jobs of the same config (but
// for their names) with the same initial weights and no step applied: "node",
// stepped by W nodes of G local ranks, and "legacy", stepped by W one-process
// workers that send each node's summed gradient.
class NodeWorkerTest : public TwoServers {
 protected:
  struct JobOnServer {
    uint64_t id = 0;
    uint64_t fingerprint = 0;
  };

  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(TwoServers::SetUp());
    for (int s = 0; s < 2; ++s) {
      stubs_[s] = NewDepotStub(server(s).grpc_address());
    }
    for (JobOnServer* job : {node_job_, legacy_job_}) {
      const JobConfig config = SmallJobConfig(
          job == node_job_ ? "node" : "legacy", kNodes, /*num_servers=*/2);
      if (!layout_.has_value()) {
        layout_.emplace(
            *Layout::Create(config.tensors, config.alignment_elems));
        plan_.emplace(
            *ShardPlan::Create(layout_->total_elems(), 2, config.chunk_elems));
      }
      v1::JobSpec spec;
      JobConfigToProto(config, &spec);
      const std::string weights =
          MakeInitialWeights(*layout_, DType::kFloat32, kSeed);
      for (uint32_t s = 0; s < 2; ++s) {
        v1::CreateJobResponse created;
        grpc::Status status = RawCreateJob(*stubs_[s], spec, s, &created);
        ASSERT_TRUE(status.ok()) << status.error_message();
        job[s] = {created.job_id(), created.fingerprint()};
        const ShardRange& shard = plan_->shard(s);
        status = RawInitWeights(
            *stubs_[s],
            MakeInitHeader(job[s].id, job[s].fingerprint, v1::DTYPE_FP32),
            MakeChunks(*plan_, shard.first_chunk, shard.end_chunk,
                       weights.data(), DType::kFloat32));
        ASSERT_TRUE(status.ok()) << status.error_message();
      }
    }
  }

  // Local rank g of node n's gradient for `step` (every GPU's differs).
  std::string LocalGrad(uint64_t step, uint32_t node, uint32_t g) const {
    return MakeGradients(*layout_, DType::kFloat32, kSeed, step,
                         node * kLocalRanks + g);
  }

  // What node n's reduce-scatter sums: its local ranks' gradients, fp32,
  // in local-rank order.
  std::string NodeSum(uint64_t step, uint32_t node) const {
    const uint64_t n = layout_->total_elems();
    std::vector<float> sum(n);
    for (uint32_t g = 0; g < kLocalRanks; ++g) {
      const std::string grad = LocalGrad(step, node, g);
      std::vector<float> values(n);
      std::memcpy(values.data(), grad.data(), n * sizeof(float));
      for (uint64_t i = 0; i < n; ++i) {
        sum[i] = g == 0 ? values[i] : sum[i] + values[i];
      }
    }
    std::string bytes(n * sizeof(float), '\0');
    std::memcpy(bytes.data(), sum.data(), bytes.size());
    return bytes;
  }

  NodePartition Partition(uint32_t node) const {
    return *NodePartition::Create(*plan_, kLocalRanks, BucketChunks(node));
  }

  // The chunks of server s's shard that local rank g of node n owns.
  std::vector<uint64_t> Owned(uint32_t server, uint32_t node,
                              uint32_t g) const {
    const NodePartition partition = Partition(node);
    const ShardRange& shard = plan_->shard(server);
    std::vector<uint64_t> chunks;
    for (uint64_t b = 0; b < partition.num_buckets(); ++b) {
      const ChunkSpan owned = partition.owned(b, g);
      for (uint64_t c = std::max(owned.first, shard.first_chunk);
           c < std::min(owned.end, shard.end_chunk); ++c) {
        chunks.push_back(c);
      }
    }
    return chunks;
  }

  // A chunk of server s's shard that local rank g of node n owns.
  uint64_t OwnedChunk(uint32_t server, uint32_t node, uint32_t g) const {
    const std::vector<uint64_t> owned = Owned(server, node, g);
    EXPECT_FALSE(owned.empty());
    return owned.empty() ? 0 : owned.front();
  }

  std::vector<v1::Chunk> Chunks(const std::string& flat,
                                const std::vector<uint64_t>& indices) const {
    std::vector<v1::Chunk> chunks;
    for (uint64_t index : indices) {
      chunks.push_back(MakeChunk(*plan_, index, flat.data(), DType::kFloat32));
    }
    return chunks;
  }

  v1::StepHeader LegacyHeader(uint32_t server, uint64_t step,
                              uint32_t node) const {
    return MakeStepHeader(legacy_job_[server].id,
                          legacy_job_[server].fingerprint, step, node,
                          StepHyperParams(step));
  }

  // Local rank g of node n's header for the node job, with the node's shape.
  v1::StepHeader NodeHeader(uint32_t server, uint64_t step, uint32_t node,
                            uint32_t g) const {
    v1::StepHeader header =
        MakeStepHeader(node_job_[server].id, node_job_[server].fingerprint,
                       step, node, StepHyperParams(step));
    header.set_local_ranks(kLocalRanks);
    header.set_local_rank(g);
    header.set_bucket_chunks(BucketChunks(node));
    return header;
  }

  // The stream of local rank g of node n: its own chunks of the shard.
  StepStreamPlan LocalRankPlan(uint32_t server, uint64_t step, uint32_t node,
                               uint32_t g) const {
    return MakeStepPlan(NodeHeader(server, step, node, g),
                        Chunks(NodeSum(step, node), Owned(server, node, g)));
  }

  // The weights each stream of `plans` got (plan i from node node_of[i]),
  // gathered per node; a chunk answered twice to one node fails the test.
  static std::vector<WeightsByChunk> GatherWeights(
      const std::vector<StepStreamResult>& results,
      const std::vector<uint32_t>& node_of) {
    std::vector<WeightsByChunk> by_node(kNodes);
    for (size_t i = 0; i < results.size(); ++i) {
      for (const v1::Chunk& chunk : results[i].weights) {
        EXPECT_TRUE(
            by_node[node_of[i]].emplace(chunk.index(), chunk.payload()).second)
            << "chunk " << chunk.index() << " answered twice to node "
            << node_of[i];
      }
    }
    return by_node;
  }

  // Step `step` of the node job on server s: every local rank of every node
  // sends the chunks it owns, on its own stream. Returns what each node got.
  std::vector<WeightsByChunk> NodeStep(uint32_t server, uint64_t step) {
    std::vector<StepStreamPlan> plans;
    std::vector<uint32_t> node_of;
    for (uint32_t node = 0; node < kNodes; ++node) {
      for (uint32_t g = 0; g < kLocalRanks; ++g) {
        plans.push_back(LocalRankPlan(server, step, node, g));
        node_of.push_back(node);
      }
    }
    const std::vector<StepStreamResult> results =
        RunStepStreams(*stubs_[server], plans);
    for (size_t i = 0; i < results.size(); ++i) {
      EXPECT_TRUE(results[i].status.ok())
          << "stream " << i << ": " << results[i].status.error_message();
      // A stream is answered exactly the chunks it sent.
      EXPECT_EQ(results[i].weights.size(), plans[i].messages.size() - 1);
    }
    return GatherWeights(results, node_of);
  }

  // The same step of the legacy job: one stream per worker, every chunk of
  // the shard, the node's sum as its gradient.
  std::vector<WeightsByChunk> LegacyStep(uint32_t server, uint64_t step) {
    const ShardRange& shard = plan_->shard(server);
    std::vector<StepStreamPlan> plans;
    for (uint32_t node = 0; node < kNodes; ++node) {
      const std::string sum = NodeSum(step, node);
      plans.push_back(MakeStepPlan(
          LegacyHeader(server, step, node),
          MakeChunks(*plan_, shard.first_chunk, shard.end_chunk, sum.data(),
                     DType::kFloat32)));
    }
    const std::vector<StepStreamResult> results =
        RunStepStreams(*stubs_[server], plans);
    for (const StepStreamResult& result : results) {
      EXPECT_TRUE(result.status.ok()) << result.status.error_message();
    }
    return GatherWeights(results, {0, 1});
  }

  v1::JobStatus Status(uint32_t server, const JobOnServer* job) {
    v1::JobStatus status;
    const grpc::Status rpc =
        RawGetJob(*stubs_[server], job[server].id, true, &status);
    EXPECT_TRUE(rpc.ok()) << rpc.error_message();
    return status;
  }

  // The node job's state on server s is bitwise the legacy job's, both at
  // `step`, with nothing pending.
  void ExpectSameState(uint32_t server, uint64_t step) {
    const v1::JobStatus node = Status(server, node_job_);
    const v1::JobStatus legacy = Status(server, legacy_job_);
    EXPECT_EQ(node.step(), step);
    EXPECT_EQ(legacy.step(), step);
    EXPECT_EQ(node.pending_step(), 0u);
    EXPECT_EQ(node.state_checksum(), legacy.state_checksum())
        << "server " << server;
  }

  // One stream the server must reject at once; a server that took its chunk
  // instead would hold it open for the other node until this deadline.
  grpc::Status RunStream(uint32_t server, const StepStreamPlan& plan) {
    return RunStepStreams(*stubs_[server], {plan}, absl::Seconds(20))
        .front()
        .status;
  }

  std::unique_ptr<v1::Depot::Stub> stubs_[2];
  JobOnServer node_job_[2];
  JobOnServer legacy_job_[2];
  std::optional<Layout> layout_;
  std::optional<ShardPlan> plan_;
};

TEST_F(NodeWorkerTest, NodesOfLocalRanksStepBitwiseLikeProcessesSendingTheSum) {
  // The partitions cover both cases: local ranks that own chunks on both
  // servers (node 0), and local ranks that own nothing on one of them (node
  // 1), whose streams there carry a header and no chunk.
  for (uint32_t g = 0; g < kLocalRanks; ++g) {
    EXPECT_FALSE(Owned(0, 0, g).empty());
    EXPECT_FALSE(Owned(1, 0, g).empty());
  }
  EXPECT_TRUE(Owned(0, 1, 1).empty());
  EXPECT_TRUE(Owned(1, 1, 0).empty());
  for (uint64_t step = 1; step <= kSteps; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    for (uint32_t s = 0; s < 2; ++s) {
      SCOPED_TRACE(absl::StrCat("server ", s));
      const std::vector<WeightsByChunk> node = NodeStep(s, step);
      const std::vector<WeightsByChunk> legacy = LegacyStep(s, step);
      for (uint32_t n = 0; n < kNodes; ++n) {
        // Each node got every chunk of the shard back exactly once, over
        // whichever local rank sent it, and the same bytes.
        EXPECT_EQ(node[n].size(), plan_->shard(s).num_chunks());
        EXPECT_TRUE(node[n] == legacy[n]) << "weights returned to node " << n;
      }
      ExpectSameState(s, step);
    }
  }
}

TEST_F(NodeWorkerTest, AChunkFromTheWrongLocalRankIsInvalidArgument) {
  const uint64_t theirs = OwnedChunk(0, /*node=*/0, /*g=*/1);
  StateChecksumWatch before;
  ASSERT_NO_FATAL_FAILURE(before.Record(*stubs_[0], node_job_[0].id));
  const std::string sum = NodeSum(1, 0);
  // Local rank 0 sends a chunk of local rank 1.
  grpc::Status status = RunStream(
      0, MakeStepPlan(NodeHeader(0, 1, 0, 0), Chunks(sum, {theirs})));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(),
            absl::StrCat("chunk ", theirs,
                         " of step 1 belongs to local rank 1 of worker 0's 2 "
                         "local ranks (bucket_chunks 4), but local rank 0 "
                         "sent it"));
  // A weights override for it from local rank 0 is refused the same way.
  StepStreamPlan override_plan = MakeStepPlan(NodeHeader(0, 1, 0, 0), {});
  v1::WeightsOverride* piece =
      override_plan.messages.emplace_back().mutable_weights_override();
  piece->set_chunk_index(theirs);
  piece->set_payload(std::string(sizeof(float), '\0'));
  status = RunStream(0, override_plan);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr(absl::StrCat("weights override: chunk ", theirs,
                                     " of step 1 belongs to local rank 1")));
  v1::JobStatus after;
  ASSERT_NO_FATAL_FAILURE(
      before.ExpectUnchanged(*stubs_[0], node_job_[0].id, &after));
  EXPECT_EQ(after.step(), 0u);
  EXPECT_EQ(after.pending_step(), 0u) << "a rejected chunk is pending";

  // The correct step then runs as if nothing had happened.
  for (uint32_t s = 0; s < 2; ++s) {
    NodeStep(s, 1);
    LegacyStep(s, 1);
    ExpectSameState(s, 1);
  }
}

TEST_F(NodeWorkerTest, StreamsOfOneWorkersStepWithOtherShapesAreFailedPrecondition) {
  // Server 0: local rank 0 of node 0 comes first with the node's shape.
  v1::StepHeader other_buckets = NodeHeader(0, 1, 0, 1);
  other_buckets.set_bucket_chunks(2 * BucketChunks(0));
  v1::StepHeader one_process = LegacyHeader(0, 1, 0);
  one_process.set_job_id(node_job_[0].id);
  one_process.set_fingerprint(node_job_[0].fingerprint);
  std::vector<StepStreamPlan> plans = {
      LocalRankPlan(0, 1, 0, 0),
      MakeStepPlan(other_buckets, {}),
      MakeStepPlan(one_process, {}),
      LocalRankPlan(0, 1, 0, 1),
      LocalRankPlan(0, 1, 1, 0),
      LocalRankPlan(0, 1, 1, 1),
  };
  // The server handles each stream on its own: the first must be handled
  // before the others' headers come (its chunks then wait for node 1).
  const auto first_handled = [this](uint32_t server) {
    return [this, server](size_t i) {
      if (i != 0) return;
      const absl::Time deadline = absl::Now() + absl::Seconds(30);
      v1::JobStatus status;
      while (absl::Now() < deadline) {
        ASSERT_TRUE(
            RawGetJob(*stubs_[server], node_job_[server].id, false, &status)
                .ok());
        if (status.pending_step() == 1) return;
        absl::SleepFor(absl::Milliseconds(1));
      }
      FAIL() << "the first stream's chunks never showed as pending";
    };
  };
  std::vector<StepStreamResult> results =
      RunStepStreams(*stubs_[0], plans, absl::Minutes(2), first_handled(0));
  EXPECT_EQ(results[1].status.error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(results[1].status.error_message(),
            "worker 0 in step 1 declares itself 2 local ranks, bucket_chunks 8 "
            "but its earlier Step stream of the step declared 2 local ranks, "
            "bucket_chunks 4: every stream of a worker's step must send the "
            "same local_ranks and bucket_chunks");
  EXPECT_EQ(results[2].status.error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(results[2].status.error_message(),
              HasSubstr("declares itself one process (local_ranks 0) but its "
                        "earlier Step stream of the step declared 2 local "
                        "ranks, bucket_chunks 4"));
  for (size_t i : {0, 3, 4, 5}) {
    EXPECT_TRUE(results[i].status.ok())
        << "stream " << i << ": " << results[i].status.error_message();
  }
  LegacyStep(0, 1);
  ExpectSameState(0, 1);

  // Server 1: a one-process stream of node 0 first, then a node stream.
  v1::StepHeader first = LegacyHeader(1, 1, 0);
  first.set_job_id(node_job_[1].id);
  first.set_fingerprint(node_job_[1].fingerprint);
  const ShardRange& shard = plan_->shard(1);
  const std::string sum = NodeSum(1, 0);
  plans = {
      MakeStepPlan(first, MakeChunks(*plan_, shard.first_chunk,
                                     shard.end_chunk, sum.data(),
                                     DType::kFloat32)),
      LocalRankPlan(1, 1, 0, 1),
      LocalRankPlan(1, 1, 1, 0),
      LocalRankPlan(1, 1, 1, 1),
  };
  results =
      RunStepStreams(*stubs_[1], plans, absl::Minutes(2), first_handled(1));
  EXPECT_EQ(results[1].status.error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(results[1].status.error_message(),
              HasSubstr("declares itself 2 local ranks, bucket_chunks 4 but "
                        "its earlier Step stream of the step declared one "
                        "process (local_ranks 0)"));
  for (size_t i : {0, 2, 3}) {
    EXPECT_TRUE(results[i].status.ok())
        << "stream " << i << ": " << results[i].status.error_message();
  }
  LegacyStep(1, 1);
  ExpectSameState(1, 1);
}

TEST_F(NodeWorkerTest, BadNodeShapesInTheHeaderAreInvalidArgument) {
  struct Case {
    uint32_t local_ranks;
    uint32_t local_rank;
    uint64_t bucket_chunks;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {0, 1, 0, "local_ranks is 0 (the worker is one process) but local_rank "
                "is 1 and bucket_chunks 0"},
      {0, 0, 4, "local_ranks is 0 (the worker is one process) but local_rank "
                "is 0 and bucket_chunks 4"},
      {2, 0, 0, "bucket_chunks: must be a positive multiple of local_ranks "
                "(2), is 0"},
      {2, 0, 3, "bucket_chunks: must be a positive multiple of local_ranks "
                "(2), is 3"},
      {2, 2, 4, "local_rank 2 is out of range: the node has 2 local ranks"},
      {4096, 0, 4096, "local_ranks is 4096, more than the 1024 local ranks"},
  };
  StateChecksumWatch before;
  ASSERT_NO_FATAL_FAILURE(before.Record(*stubs_[0], node_job_[0].id));
  const std::string sum = NodeSum(1, 0);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.expected);
    v1::StepHeader header = NodeHeader(0, 1, 0, 0);
    header.set_local_ranks(c.local_ranks);
    header.set_local_rank(c.local_rank);
    header.set_bucket_chunks(c.bucket_chunks);
    const grpc::Status status =
        RunStream(0, MakeStepPlan(header, Chunks(sum, {0})));
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr(c.expected));
    v1::JobStatus after;
    ASSERT_NO_FATAL_FAILURE(
        before.ExpectUnchanged(*stubs_[0], node_job_[0].id, &after));
    EXPECT_EQ(after.pending_step(), 0u);
  }
  // No rejected header fixed node 0's shape for the step.
  NodeStep(0, 1);
  LegacyStep(0, 1);
  ExpectSameState(0, 1);
}

TEST_F(NodeWorkerTest, TheSameChunkFromTwoLocalRanksIsRejected) {
  // Chunk `mine` is local rank 0's; its first stream carries only it and
  // stays open, waiting for node 1, while the others arrive.
  const uint64_t mine = OwnedChunk(0, /*node=*/0, /*g=*/0);
  const std::string sum = NodeSum(1, 0);
  std::vector<uint64_t> rest = Owned(0, 0, 0);
  rest.erase(std::find(rest.begin(), rest.end(), mine));
  const std::vector<StepStreamPlan> plans = {
      MakeStepPlan(NodeHeader(0, 1, 0, 0), Chunks(sum, {mine})),
      // Local rank 1 sends it too: not its chunk.
      MakeStepPlan(NodeHeader(0, 1, 0, 1), Chunks(sum, {mine})),
      // A second stream of local rank 0 sends it again: a duplicate.
      MakeStepPlan(NodeHeader(0, 1, 0, 0), Chunks(sum, {mine})),
      MakeStepPlan(NodeHeader(0, 1, 0, 0), Chunks(sum, rest)),
      LocalRankPlan(0, 1, 0, 1),
      LocalRankPlan(0, 1, 1, 0),
      LocalRankPlan(0, 1, 1, 1),
  };
  const std::vector<StepStreamResult> results =
      RunStepStreams(*stubs_[0], plans);
  EXPECT_EQ(results[1].status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(results[1].status.error_message(),
              HasSubstr(absl::StrCat("chunk ", mine,
                                     " of step 1 belongs to local rank 0")));
  // Which of local rank 0's two streams the server read first is up to its
  // threads: that one is answered, the other is the duplicate.
  EXPECT_THAT((std::vector<grpc::StatusCode>{results[0].status.error_code(),
                                             results[2].status.error_code()}),
              UnorderedElementsAre(grpc::StatusCode::OK,
                                   grpc::StatusCode::ALREADY_EXISTS));
  const StepStreamResult& duplicate =
      results[0].status.ok() ? results[2] : results[0];
  EXPECT_THAT(duplicate.status.error_message(),
              HasSubstr(absl::StrCat("duplicate contribution: worker 0 "
                                     "already sent chunk ",
                                     mine, " of step 1")));
  for (size_t i : {3, 4, 5, 6}) {
    EXPECT_TRUE(results[i].status.ok())
        << "stream " << i << ": " << results[i].status.error_message();
  }
  LegacyStep(0, 1);
  ExpectSameState(0, 1);
}

}  // namespace
}  // namespace depot::testing
