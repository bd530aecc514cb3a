// Helpers of the checkpoint tests: checkpoints of made-up but consistent
// state (and TempDir, server/tests/temp_dir.h).
#ifndef DEPOT_SERVER_TESTS_CHECKPOINT_TEST_UTIL_H_
#define DEPOT_SERVER_TESTS_CHECKPOINT_TEST_UTIL_H_

#include <cstdint>
#include <fstream>
#include <iterator>
#include <random>
#include <string>

#include "depot/job_config.h"
#include "gtest/gtest.h"
#include "server/job_shape.h"
#include "server/shard_state.h"
#include "server/tests/temp_dir.h"

namespace depot::testing {

inline std::string ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void WriteFileBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// AdamW with bf16 exp_avg_sq (slots of two sizes) over three tensors and
// chunks of 16 elements, two servers.
inline JobConfig CheckpointTestConfig(const std::string& name = "ckpt-job") {
  JobConfig config;
  config.name = name;
  config.tensors = {{"embed", 20, 0}, {"fc.weight", 13, 1}, {"fc.bias", 7, 1}};
  config.num_workers = 2;
  config.num_servers = 2;
  config.optimizer.kind = OptimizerKind::kAdamW;
  config.optimizer.lr = 1e-3;
  config.optimizer.exp_avg_sq_dtype = DType::kBFloat16;
  config.chunk_elems = 16;
  config.alignment_elems = 4;
  return config;
}

// Server `server`'s shard of `config` at `step`, filled with random bytes
// from `seed` and tensor counts at most `step`.
inline ShardCheckpoint RandomCheckpoint(const JobConfig& config,
                                        uint32_t server, uint64_t step,
                                        uint32_t seed) {
  const JobShape shape = JobShape::Create(config, server).value();
  std::mt19937_64 random(seed);
  ShardCheckpoint checkpoint;
  checkpoint.config = config;
  checkpoint.fingerprint = shape.fingerprint();
  checkpoint.server_index = server;
  checkpoint.step = step;
  for (uint64_t index = shape.shard().first_chunk;
       index < shape.shard().end_chunk; ++index) {
    const ChunkRange range = shape.plan().chunk(index);
    ChunkSnapshot& chunk = checkpoint.chunks.emplace_back();
    chunk.index = index;
    chunk.applied_step = step;
    for (size_t i = 0;
         i < shape.layout().SegmentsIn(range.begin, range.end).size(); ++i) {
      chunk.tensor_steps.push_back(random() % (step + 1));
      chunk.optimizer_step =
          std::max(chunk.optimizer_step, chunk.tensor_steps.back());
    }
    chunk.master.resize(range.size() * 4);
    for (char& c : chunk.master) c = static_cast<char>(random());
    for (int k = 0; k < shape.slots(); ++k) {
      std::string& slot = chunk.slots.emplace_back(
          range.size() * DTypeSize(OptimizerSlotDType(shape.slot_config(), k)),
          '\0');
      for (char& c : slot) c = static_cast<char>(random());
    }
  }
  return checkpoint;
}

// Every field of two checkpoints equal, bytes of the state included.
inline void ExpectSameCheckpoint(const ShardCheckpoint& a,
                                 const ShardCheckpoint& b) {
  EXPECT_EQ(Fingerprint(a.config), Fingerprint(b.config));
  EXPECT_EQ(a.fingerprint, b.fingerprint);
  EXPECT_EQ(a.server_index, b.server_index);
  EXPECT_EQ(a.step, b.step);
  ASSERT_EQ(a.chunks.size(), b.chunks.size());
  for (size_t i = 0; i < a.chunks.size(); ++i) {
    EXPECT_EQ(a.chunks[i].index, b.chunks[i].index);
    EXPECT_EQ(a.chunks[i].applied_step, b.chunks[i].applied_step);
    EXPECT_EQ(a.chunks[i].tensor_steps, b.chunks[i].tensor_steps);
    EXPECT_EQ(a.chunks[i].optimizer_step, b.chunks[i].optimizer_step);
    EXPECT_EQ(a.chunks[i].master, b.chunks[i].master) << "chunk " << i;
    EXPECT_EQ(a.chunks[i].slots, b.chunks[i].slots) << "chunk " << i;
    EXPECT_EQ(a.chunks[i].lacks_worker_state, b.chunks[i].lacks_worker_state)
        << "chunk " << i;
  }
}

}  // namespace depot::testing

#endif  // DEPOT_SERVER_TESTS_CHECKPOINT_TEST_UTIL_H_
