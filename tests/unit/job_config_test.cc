#include "depot/job_config.h"

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
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

// Issue 13: every size field has a bound (docs/protocol.md, "Bounds").
TEST(ValidateJobConfigTest, RejectsSizeFieldsAboveTheirBounds) {
  ExpectRejected([](JobConfig& c) { c.num_servers = kMaxServers + 1; },
                 "num_servers");
  ExpectRejected([](JobConfig& c) { c.num_servers = uint32_t{1} << 30; },
                 "num_servers");
  ExpectRejected([](JobConfig& c) { c.num_workers = kMaxWorkers + 1; },
                 "num_workers");
  ExpectRejected([](JobConfig& c) { c.num_workers = uint32_t{1} << 31; },
                 "num_workers");
  ExpectRejected(
      [](JobConfig& c) { c.name = std::string(kMaxJobNameBytes + 1, 'n'); },
      "name");
  ExpectRejected(
      [](JobConfig& c) {
        c.tensors[1].name = std::string(kMaxTensorNameBytes + 1, 't');
      },
      "tensors[1].name");
  ExpectRejected(
      [](JobConfig& c) {
        c.tensors.clear();
        for (uint64_t i = 0; i <= kMaxTensors; ++i) {
          c.tensors.push_back({std::to_string(i), 1, 0});
        }
      },
      "tensors");
}

TEST(ValidateJobConfigTest, AcceptsSizeFieldsAtTheirBounds) {
  JobConfig config = ValidJob();
  config.num_servers = kMaxServers;
  config.num_workers = kMaxWorkers;
  config.name = std::string(kMaxJobNameBytes, 'n');
  config.tensors[0].name = std::string(kMaxTensorNameBytes, 't');
  EXPECT_TRUE(ValidateJobConfig(config).ok()) << ValidateJobConfig(config);
}

// A chunk whose saved state (ExportState's StateChunk) would not fit one
// message could never be exported or imported: such a job is refused.
TEST(ValidateJobConfigTest, ChunkElemsMustLetTheChunksStateFitOneMessage) {
  JobConfig config = ValidJob();  // AdamW, fp32 moments: 12 bytes a parameter
  const uint64_t max_chunk = MaxChunkElems(config);
  EXPECT_EQ(max_chunk,
            (kWireMessageLimitBytes - kStateChunkOverheadBytes -
             2 * kStateChunkBytesPerTensor) / 12);
  config.chunk_elems = max_chunk / 64 * 64;
  EXPECT_TRUE(ValidateJobConfig(config).ok()) << ValidateJobConfig(config);
  config.chunk_elems = (max_chunk / 64 + 1) * 64;
  const absl::Status status = ValidateJobConfig(config);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find(absl::StrCat("chunk_elems: at most ",
                                               max_chunk, " for this job")),
            std::string::npos)
      << status;
  // 4 Mi elements fit with AdamW's fp32 moments (48 MiB), not with
  // AMSGrad's third slot (64 MiB and the rest).
  config.chunk_elems = uint64_t{4} << 20;
  EXPECT_TRUE(ValidateJobConfig(config).ok());
  config.optimizer.amsgrad = true;
  EXPECT_EQ(ValidateJobConfig(config).code(),
            absl::StatusCode::kInvalidArgument);
  // Unbounded before: 2^40 elements a chunk.
  ExpectRejected([](JobConfig& c) { c.chunk_elems = uint64_t{1} << 40; },
                 "chunk_elems");
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
       {OptimizerKind::kAdamW, OptimizerKind::kAdam, OptimizerKind::kSgd,
        OptimizerKind::kAdagrad, OptimizerKind::kLion}) {
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
  for (int kind : {0, 6}) {
    ExpectOptimizerRejected(
        [kind](OptimizerConfig& c) {
          c.kind = static_cast<OptimizerKind>(kind);
        },
        "optimizer.kind");
  }
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
  for (double eps : {0.0, -1e-8, kNaN, kInf}) {
    ExpectOptimizerRejected([eps](OptimizerConfig& c) { c.adam_eps = eps; },
                            "optimizer.adam_eps");
    ExpectOptimizerRejected([eps](OptimizerConfig& c) { c.adagrad_eps = eps; },
                            "optimizer.adagrad_eps");
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

TEST(ValidateOptimizerConfigTest, RejectsNegativeOrNonFiniteNewScalars) {
  // Fields that must be finite and >= 0 (0 meaning "off" where it applies).
  const std::vector<std::pair<std::string, double OptimizerConfig::*>> fields =
      {
          {"optimizer.min_lr", &OptimizerConfig::min_lr},
          {"optimizer.adagrad_lr_decay", &OptimizerConfig::adagrad_lr_decay},
          {"optimizer.adagrad_initial_accumulator_value",
           &OptimizerConfig::adagrad_initial_accumulator_value},
          {"optimizer.clip_grad", &OptimizerConfig::clip_grad},
          {"optimizer.grad_norm_skip_threshold",
           &OptimizerConfig::grad_norm_skip_threshold},
          {"optimizer.loss_scale", &OptimizerConfig::loss_scale},
      };
  for (const auto& [field, member] : fields) {
    for (double value : {-1e-3, kNaN, kInf}) {
      ExpectOptimizerRejected(
          [member, value](OptimizerConfig& c) { c.*member = value; }, field);
    }
  }
}

TEST(ValidateOptimizerConfigTest, AcceptsZeroForTheFieldsWhereZeroMeansOff) {
  OptimizerConfig config;
  config.min_lr = 0;
  config.adagrad_lr_decay = 0;
  config.adagrad_initial_accumulator_value = 0;
  config.clip_grad = 0;
  config.grad_norm_skip_threshold = 0;
  config.loss_scale = 0;
  EXPECT_TRUE(ValidateOptimizerConfig(config).ok());
}

TEST(ValidateOptimizerConfigTest, RejectsLionBetasOutsideZeroToOne) {
  for (double beta : {-0.1, 1.0, kNaN}) {
    ExpectOptimizerRejected([beta](OptimizerConfig& c) { c.lion_beta1 = beta; },
                            "optimizer.lion_beta1");
    ExpectOptimizerRejected([beta](OptimizerConfig& c) { c.lion_beta2 = beta; },
                            "optimizer.lion_beta2");
  }
}

TEST(ValidateOptimizerConfigTest, RejectsAnUnknownClipNormType) {
  ExpectOptimizerRejected(
      [](OptimizerConfig& c) {
        c.clip_grad_norm_type = static_cast<GradNormType>(0);
      },
      "optimizer.clip_grad_norm_type");
  ExpectOptimizerRejected(
      [](OptimizerConfig& c) {
        c.clip_grad_norm_type = static_cast<GradNormType>(3);
      },
      "optimizer.clip_grad_norm_type");
}

TEST(ValidateOptimizerConfigTest, RejectsNonPositiveInitialLossScale) {
  for (double scale : {0.0, -1.0, kNaN, kInf}) {
    ExpectOptimizerRejected(
        [scale](OptimizerConfig& c) { c.initial_loss_scale = scale; },
        "optimizer.initial_loss_scale");
  }
}

TEST(ValidateOptimizerConfigTest, RejectsMinLossScaleOutsideZeroToInitial) {
  for (double scale : {0.0, -1.0, kNaN, kInf}) {
    ExpectOptimizerRejected(
        [scale](OptimizerConfig& c) { c.min_loss_scale = scale; },
        "optimizer.min_loss_scale");
  }
  ExpectOptimizerRejected(
      [](OptimizerConfig& c) {
        c.initial_loss_scale = 1024;
        c.min_loss_scale = 2048;
      },
      "optimizer.min_loss_scale");
}

TEST(ValidateOptimizerConfigTest, AcceptsMinLossScaleEqualToInitial) {
  OptimizerConfig config;
  config.initial_loss_scale = 1024;
  config.min_loss_scale = 1024;
  EXPECT_TRUE(ValidateOptimizerConfig(config).ok());
}

TEST(ValidateOptimizerConfigTest, RejectsLossScaleWindowBelowOne) {
  for (double window : {0.0, 0.5, -1.0, kNaN, kInf}) {
    ExpectOptimizerRejected(
        [window](OptimizerConfig& c) { c.loss_scale_window = window; },
        "optimizer.loss_scale_window");
  }
}

TEST(ValidateOptimizerConfigTest, RejectsHysteresisBelowOne) {
  for (int hysteresis : {0, -2}) {
    ExpectOptimizerRejected(
        [hysteresis](OptimizerConfig& c) { c.hysteresis = hysteresis; },
        "optimizer.hysteresis");
  }
}

TEST(ValidateOptimizerConfigTest, RejectsMomentDTypesOtherThanFp32AndBf16) {
  for (DType dtype : {DType::kFloat16, static_cast<DType>(0)}) {
    ExpectOptimizerRejected(
        [dtype](OptimizerConfig& c) { c.exp_avg_dtype = dtype; },
        "optimizer.exp_avg_dtype");
    ExpectOptimizerRejected(
        [dtype](OptimizerConfig& c) { c.exp_avg_sq_dtype = dtype; },
        "optimizer.exp_avg_sq_dtype");
  }
}

// Which moment dtype field describes which slot (job_config.h): bf16 is
// accepted exactly where the optimizer keeps that slot.
TEST(ValidateOptimizerConfigTest, AcceptsBf16ForEverySlotTheOptimizerKeeps) {
  OptimizerConfig config;
  config.exp_avg_dtype = DType::kBFloat16;
  config.exp_avg_sq_dtype = DType::kBFloat16;
  for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kAdam}) {
    config.kind = kind;
    EXPECT_TRUE(ValidateOptimizerConfig(config).ok());
  }
  config = OptimizerConfig();
  config.exp_avg_dtype = DType::kBFloat16;
  config.kind = OptimizerKind::kSgd;  // momentum 0.9: momentum_buffer
  EXPECT_TRUE(ValidateOptimizerConfig(config).ok());
  config.kind = OptimizerKind::kLion;
  EXPECT_TRUE(ValidateOptimizerConfig(config).ok());
  config = OptimizerConfig();
  config.exp_avg_sq_dtype = DType::kBFloat16;
  config.kind = OptimizerKind::kAdagrad;
  EXPECT_TRUE(ValidateOptimizerConfig(config).ok());
}

TEST(ValidateOptimizerConfigTest, RejectsBf16ForASlotTheOptimizerDoesNotKeep) {
  ExpectOptimizerRejected(
      [](OptimizerConfig& c) {
        c.kind = OptimizerKind::kSgd;
        c.sgd_momentum = 0;
        c.exp_avg_dtype = DType::kBFloat16;
      },
      "optimizer.exp_avg_dtype");
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kLion}) {
    ExpectOptimizerRejected(
        [kind](OptimizerConfig& c) {
          c.kind = kind;
          c.exp_avg_sq_dtype = DType::kBFloat16;
        },
        "optimizer.exp_avg_sq_dtype");
  }
  ExpectOptimizerRejected(
      [](OptimizerConfig& c) {
        c.kind = OptimizerKind::kAdagrad;
        c.exp_avg_dtype = DType::kBFloat16;
      },
      "optimizer.exp_avg_dtype");
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

TEST(OptimizerStateSlotsTest, AdagradAndLionKeepOneSlot) {
  OptimizerConfig config;
  config.kind = OptimizerKind::kAdagrad;
  EXPECT_EQ(OptimizerStateSlots(config), 1);
  config.kind = OptimizerKind::kLion;
  EXPECT_EQ(OptimizerStateSlots(config), 1);
}

TEST(OptimizerSlotDTypeTest, FollowsTheMomentDTypeFieldOfEachSlot) {
  OptimizerConfig config;
  config.exp_avg_dtype = DType::kBFloat16;
  config.kind = OptimizerKind::kAdamW;
  EXPECT_EQ(OptimizerSlotDType(config, 0), DType::kBFloat16);
  EXPECT_EQ(OptimizerSlotDType(config, 1), DType::kFloat32);
  config.kind = OptimizerKind::kLion;
  EXPECT_EQ(OptimizerSlotDType(config, 0), DType::kBFloat16);
  config.kind = OptimizerKind::kSgd;
  EXPECT_EQ(OptimizerSlotDType(config, 0), DType::kBFloat16);
  // Adagrad's state_sum is a sum of squares: exp_avg_sq_dtype.
  config.kind = OptimizerKind::kAdagrad;
  EXPECT_EQ(OptimizerSlotDType(config, 0), DType::kFloat32);
  config.exp_avg_sq_dtype = DType::kBFloat16;
  EXPECT_EQ(OptimizerSlotDType(config, 0), DType::kBFloat16);
}

TEST(OptimizerSlotInitialValueTest, OnlyAdagradStartsAboveZero) {
  OptimizerConfig config;
  config.adagrad_initial_accumulator_value = 0.5;
  config.kind = OptimizerKind::kAdagrad;
  EXPECT_EQ(OptimizerSlotInitialValue(config, 0), 0.5);
  config.kind = OptimizerKind::kAdamW;
  EXPECT_EQ(OptimizerSlotInitialValue(config, 0), 0.0);
  EXPECT_EQ(OptimizerSlotInitialValue(config, 1), 0.0);
  config.kind = OptimizerKind::kLion;
  EXPECT_EQ(OptimizerSlotInitialValue(config, 0), 0.0);
}

TEST(OptimizerStateBytesPerParamTest, CountsTheMasterAndEachSlotInItsDType) {
  OptimizerConfig config;
  config.kind = OptimizerKind::kAdamW;
  EXPECT_EQ(OptimizerStateBytesPerParam(config), 12u);
  config.exp_avg_dtype = DType::kBFloat16;
  EXPECT_EQ(OptimizerStateBytesPerParam(config), 10u);
  config.exp_avg_sq_dtype = DType::kBFloat16;
  EXPECT_EQ(OptimizerStateBytesPerParam(config), 8u);
  config.kind = OptimizerKind::kLion;
  EXPECT_EQ(OptimizerStateBytesPerParam(config), 6u);
  config.kind = OptimizerKind::kSgd;
  config.sgd_momentum = 0;
  config.exp_avg_dtype = DType::kFloat32;
  EXPECT_EQ(OptimizerStateBytesPerParam(config), 4u);
}

TEST(ValidateJobConfigTest, RejectsAmsgradForKindsWithoutIt) {
  ExpectRejected(
      [](JobConfig& c) {
        c.optimizer.kind = OptimizerKind::kSgd;
        c.optimizer.amsgrad = true;
      },
      "optimizer.amsgrad");
}

TEST(ValidateJobConfigTest, GroupOptimizersNeedOnePerParamGroup) {
  ExpectRejected([](JobConfig& c) { c.group_optimizers = {c.optimizer}; },
                 "group_optimizers");
  JobConfig config = ValidJob();
  config.group_optimizers = {config.optimizer, config.optimizer};
  config.group_optimizers[1].adam_beta1 = 0.5;
  config.group_optimizers[1].amsgrad = true;
  EXPECT_TRUE(ValidateJobConfig(config).ok());
}

TEST(ValidateJobConfigTest, GroupOptimizersKeepTheJobWideFields) {
  ExpectRejected(
      [](JobConfig& c) {
        c.group_optimizers = {c.optimizer, c.optimizer};
        c.group_optimizers[1].clip_grad = 1.0;
      },
      "group_optimizers[1].clip_grad");
  ExpectRejected(
      [](JobConfig& c) {
        c.group_optimizers = {c.optimizer, c.optimizer};
        c.group_optimizers[0].kind = OptimizerKind::kSgd;
      },
      "group_optimizers[0].kind");
  ExpectRejected(
      [](JobConfig& c) {
        c.group_optimizers = {c.optimizer, c.optimizer};
        c.group_optimizers[1].adam_beta2 = 1.0;
      },
      "group_optimizers[1]");
}

TEST(JobStateSlotsTest, IsTheMostAnyGroupKeeps) {
  JobConfig config = ValidJob();
  EXPECT_EQ(JobStateSlots(config), 2);
  config.group_optimizers = {config.optimizer, config.optimizer};
  config.group_optimizers[1].amsgrad = true;
  EXPECT_EQ(JobStateSlots(config), 3);
  EXPECT_EQ(GroupOptimizer(config, 1).amsgrad, true);
  EXPECT_EQ(GroupOptimizer(config, 0).amsgrad, false);
  config.optimizer.kind = OptimizerKind::kSgd;
  config.optimizer.sgd_momentum = 0;
  config.group_optimizers = {config.optimizer, config.optimizer};
  config.group_optimizers[1].sgd_momentum = 0.9;
  EXPECT_EQ(JobStateSlots(config), 1);
  EXPECT_EQ(OptimizerStateBytesPerParam(JobSlotConfig(config)), 8u);
}

}  // namespace
}  // namespace depot
