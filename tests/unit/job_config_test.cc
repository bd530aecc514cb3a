#include "depot/job_config.h"

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "gtest/gtest.h"

namespace depot {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

JobConfig ValidJob() {
  JobConfig config;
  config.name = "llama";
  config.tensors = {{"embed", 1000, 0}, {"norm", 10, 1}};
  config.chunk_elems = 256;
  config.alignment_elems = 64;
  return config;
}

// Applies `mutate` to a valid job and expects INVALID_ARGUMENT naming `field`.
void ExpectRejected(const std::function<void(JobConfig&)>& mutate,
                    const std::string& field) {
  JobConfig config = ValidJob();
  mutate(config);
  const absl::Status status = ValidateJobConfig(config);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field;
  EXPECT_EQ(status.message().substr(0, field.size() + 1), field + ":")
      << status.message();
}

TEST(ValidateJobConfigTest, AcceptsTheDefaultsWithALayout) {
  EXPECT_TRUE(ValidateJobConfig(ValidJob()).ok());
}

TEST(ValidateJobConfigTest, RejectsAnEmptyName) {
  ExpectRejected([](JobConfig& c) { c.name.clear(); }, "name");
}

TEST(ValidateJobConfigTest, RejectsAnInvalidLayoutNamingTheTensor) {
  ExpectRejected([](JobConfig& c) { c.tensors[1].numel = 0; },
                 "tensors[1].numel");
  ExpectRejected([](JobConfig& c) { c.tensors.clear(); }, "tensors");
  ExpectRejected([](JobConfig& c) { c.alignment_elems = 3; },
                 "alignment_elems");
}

TEST(ValidateJobConfigTest, RejectsZeroWorkers) {
  ExpectRejected([](JobConfig& c) { c.num_workers = 0; }, "num_workers");
}

TEST(ValidateJobConfigTest, RejectsZeroServers) {
  ExpectRejected([](JobConfig& c) { c.num_servers = 0; }, "num_servers");
}

TEST(ValidateJobConfigTest, RejectsZeroChunkElems) {
  ExpectRejected([](JobConfig& c) { c.chunk_elems = 0; }, "chunk_elems");
}

TEST(ValidateJobConfigTest, RejectsChunksThatAreNotAMultipleOfTheAlignment) {
  ExpectRejected([](JobConfig& c) { c.chunk_elems = 100; }, "chunk_elems");
}

TEST(ValidateJobConfigTest, RejectsUnknownDTypes) {
  ExpectRejected([](JobConfig& c) { c.grad_dtype = static_cast<DType>(0); },
                 "grad_dtype");
  ExpectRejected([](JobConfig& c) { c.weight_dtype = static_cast<DType>(9); },
                 "weight_dtype");
}

TEST(ValidateJobConfigTest, RejectsAnInvalidOptimizerNamingTheField) {
  ExpectRejected([](JobConfig& c) { c.optimizer.lr = -1; }, "optimizer.lr");
}

// Applies `mutate` to the default optimizer config and expects INVALID_ARGUMENT
// naming `field`.
void ExpectOptimizerRejected(
    const std::function<void(OptimizerConfig&)>& mutate,
    const std::string& field) {
  OptimizerConfig config;
  mutate(config);
  const absl::Status status = ValidateOptimizerConfig(config);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field;
  EXPECT_EQ(status.message().substr(0, field.size() + 1), field + ":")
      << status.message();
}

TEST(ValidateOptimizerConfigTest, AcceptsTheDefaultsForEveryKind) {
  for (OptimizerKind kind :
       {OptimizerKind::kAdamW, OptimizerKind::kAdam, OptimizerKind::kSgd}) {
    OptimizerConfig config;
    config.kind = kind;
    EXPECT_TRUE(ValidateOptimizerConfig(config).ok());
  }
}

TEST(ValidateOptimizerConfigTest, AcceptsZeroLrWeightDecayAndBetas) {
  OptimizerConfig config;
  config.lr = 0;
  config.weight_decay = 0;
  config.adam_beta1 = 0;
  config.adam_beta2 = 0;
  config.sgd_momentum = 0;
  EXPECT_TRUE(ValidateOptimizerConfig(config).ok());
}

TEST(ValidateOptimizerConfigTest, RejectsAnUnknownKind) {
  ExpectOptimizerRejected(
      [](OptimizerConfig& c) { c.kind = static_cast<OptimizerKind>(0); },
      "optimizer.kind");
}

TEST(ValidateOptimizerConfigTest, RejectsNegativeOrNonFiniteLr) {
  for (double lr : {-1e-3, kNaN, kInf}) {
    ExpectOptimizerRejected([lr](OptimizerConfig& c) { c.lr = lr; },
                            "optimizer.lr");
  }
}

TEST(ValidateOptimizerConfigTest, RejectsNegativeOrNonFiniteWeightDecay) {
  for (double wd : {-0.1, kNaN, kInf}) {
    ExpectOptimizerRejected([wd](OptimizerConfig& c) { c.weight_decay = wd; },
                            "optimizer.weight_decay");
  }
}

TEST(ValidateOptimizerConfigTest, RejectsBetasOutsideZeroToOne) {
  for (double beta : {-0.1, 1.0, 1.5, kNaN}) {
    ExpectOptimizerRejected([beta](OptimizerConfig& c) { c.adam_beta1 = beta; },
                            "optimizer.adam_beta1");
    ExpectOptimizerRejected([beta](OptimizerConfig& c) { c.adam_beta2 = beta; },
                            "optimizer.adam_beta2");
  }
}

TEST(ValidateOptimizerConfigTest, RejectsNonPositiveEps) {
  for (double eps : {0.0, -1e-8, kNaN}) {
    ExpectOptimizerRejected([eps](OptimizerConfig& c) { c.adam_eps = eps; },
                            "optimizer.adam_eps");
  }
}

TEST(ValidateOptimizerConfigTest, RejectsNegativeMomentum) {
  for (double momentum : {-0.5, kNaN}) {
    ExpectOptimizerRejected(
        [momentum](OptimizerConfig& c) { c.sgd_momentum = momentum; },
        "optimizer.sgd_momentum");
  }
}

TEST(ValidateOptimizerConfigTest, RejectsNesterovWithoutMomentum) {
  ExpectOptimizerRejected(
      [](OptimizerConfig& c) {
        c.sgd_nesterov = true;
        c.sgd_momentum = 0;
      },
      "optimizer.sgd_nesterov");
}

TEST(ValidateOptimizerConfigTest, RejectsNesterovWithDampening) {
  ExpectOptimizerRejected(
      [](OptimizerConfig& c) {
        c.sgd_nesterov = true;
        c.sgd_dampening = 0.1;
      },
      "optimizer.sgd_nesterov");
}

TEST(OptimizerStateSlotsTest, AdamKeepsTwoMoments) {
  OptimizerConfig config;
  config.kind = OptimizerKind::kAdamW;
  EXPECT_EQ(OptimizerStateSlots(config), 2);
  config.kind = OptimizerKind::kAdam;
  EXPECT_EQ(OptimizerStateSlots(config), 2);
}

TEST(OptimizerStateSlotsTest, SgdKeepsABufferOnlyWithMomentum) {
  OptimizerConfig config;
  config.kind = OptimizerKind::kSgd;
  config.sgd_momentum = 0.9;
  EXPECT_EQ(OptimizerStateSlots(config), 1);
  config.sgd_momentum = 0;
  EXPECT_EQ(OptimizerStateSlots(config), 0);
}

}  // namespace
}  // namespace depot
