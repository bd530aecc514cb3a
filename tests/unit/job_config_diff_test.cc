#include "depot/job_config_diff.h"

#include <cmath>
#include <string>
#include <vector>

#include "depot/job_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/job_config_mutations.h"

namespace depot {
namespace {

using ::depot::testing::BaseJob;
using ::depot::testing::SingleFieldMutations;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::StartsWith;

std::vector<std::string> Differences(const JobConfig& existing,
                                     const JobConfig& request) {
  return JobConfigDifferences(existing, "existing job", request,
                              "this request");
}

TEST(JobConfigDiffTest, EqualConfigsHaveNoDifferences) {
  EXPECT_THAT(Differences(BaseJob(), BaseJob()), IsEmpty());
  EXPECT_EQ(DescribeJobConfigDifferences(BaseJob(), "a", BaseJob(), "b"), "");
}

// Whatever changes the fingerprint is reported, under the field's own name:
// a field the fingerprint covers and the comparison forgot fails here.
TEST(JobConfigDiffTest, ReportsEveryFieldTheFingerprintCovers) {
  // The server count too, which only FingerprintWithServerCount covers: the
  // servers compare it on its own, and a state's loader ignores it.
  for (const auto& [field, mutate] : SingleFieldMutations()) {
    JobConfig request = BaseJob();
    mutate(request);
    ASSERT_NE(FingerprintWithServerCount(request),
              FingerprintWithServerCount(BaseJob()))
        << field;
    const std::vector<std::string> lines = Differences(BaseJob(), request);
    ASSERT_FALSE(lines.empty()) << field;
    EXPECT_THAT(lines.front(), StartsWith(field + ": ")) << field;
  }
}

TEST(JobConfigDiffTest, NamesEachFieldWithBothValuesAndTheirSides) {
  JobConfig existing = BaseJob();
  JobConfig request = BaseJob();
  existing.optimizer.lr = 0.001;
  request.optimizer.lr = 0.0003;
  existing.grad_dtype = DType::kBFloat16;
  request.grad_dtype = DType::kFloat32;
  EXPECT_THAT(
      Differences(existing, request),
      ElementsAre("optimizer.lr: 0.001 (existing job) vs 0.0003 (this request)",
                  "grad_dtype: bf16 (existing job) vs fp32 (this request)"));
}

TEST(JobConfigDiffTest, KeepsEachValueWithItsOwnSide) {
  JobConfig a = BaseJob();
  JobConfig b = BaseJob();
  a.num_workers = 2;
  b.num_workers = 4;
  EXPECT_THAT(JobConfigDifferences(a, "saved state", b, "this job"),
              ElementsAre("num_workers: 2 (saved state) vs 4 (this job)"));
  EXPECT_THAT(JobConfigDifferences(b, "saved state", a, "this job"),
              ElementsAre("num_workers: 4 (saved state) vs 2 (this job)"));
}

TEST(JobConfigDiffTest, DoublesOneUlpApartPrintDifferently) {
  JobConfig request = BaseJob();
  request.optimizer.lr = std::nextafter(BaseJob().optimizer.lr, 1.0);
  EXPECT_THAT(Differences(BaseJob(), request),
              ElementsAre("optimizer.lr: 0.001 (existing job) vs "
                          "0.0010000000000000002 (this request)"));
}

TEST(JobConfigDiffTest, DoublesPrintPlainUnlessTinyOrHuge) {
  JobConfig request = BaseJob();
  request.optimizer.adam_eps = 1e-6;
  request.optimizer.loss_scale_window = 2000;
  request.optimizer.initial_loss_scale = 1e20;
  EXPECT_THAT(
      Differences(BaseJob(), request),
      ElementsAre(
          "optimizer.adam_eps: 1e-08 (existing job) vs 1e-06 (this request)",
          "optimizer.initial_loss_scale: 4294967296 (existing job) vs 1e+20 "
          "(this request)",
          "optimizer.loss_scale_window: 1000 (existing job) vs 2000 (this "
          "request)"));
}

TEST(JobConfigDiffTest, NegativeZeroDiffersAsInTheFingerprint) {
  JobConfig request = BaseJob();
  request.optimizer.min_lr = -0.0;
  EXPECT_THAT(
      Differences(BaseJob(), request),
      ElementsAre("optimizer.min_lr: 0 (existing job) vs -0 (this request)"));
}

TEST(JobConfigDiffTest, PrintsEnumsAndFlagsByName) {
  JobConfig request = BaseJob();
  request.optimizer.kind = OptimizerKind::kSgd;
  request.optimizer.sgd_nesterov = true;
  request.optimizer.clip_grad_norm_type = GradNormType::kInf;
  request.optimizer.exp_avg_dtype = DType::kBFloat16;
  EXPECT_THAT(
      Differences(BaseJob(), request),
      ElementsAre(
          "optimizer.kind: AdamW (existing job) vs SGD (this request)",
          "optimizer.sgd_nesterov: false (existing job) vs true (this request)",
          "optimizer.exp_avg_dtype: fp32 (existing job) vs bf16 (this "
          "request)",
          "optimizer.clip_grad_norm_type: L2 (existing job) vs inf (this "
          "request)"));
}

TEST(JobConfigDiffTest, PrintsValuesOutsideTheEnumsAsNumbers) {
  JobConfig request = BaseJob();
  request.optimizer.kind = static_cast<OptimizerKind>(9);
  request.weight_dtype = static_cast<DType>(7);
  EXPECT_THAT(Differences(BaseJob(), request),
              ElementsAre("optimizer.kind: AdamW (existing job) vs kind 9 "
                          "(this request)",
                          "weight_dtype: bf16 (existing job) vs dtype 7 (this "
                          "request)"));
}

TEST(JobConfigDiffTest, QuotesTheName) {
  JobConfig request = BaseJob();
  request.name = "gpt\n2";
  EXPECT_THAT(
      Differences(BaseJob(), request),
      ElementsAre(R"(name: "gpt" (existing job) vs "gpt\n2" (this request))"));
}

TEST(JobConfigDiffTest, ShowsTheFirstDifferingTensorWithAllItsFields) {
  JobConfig existing = BaseJob();
  existing.tensors = {{"a", 10, 0}, {"b", 20, 0}, {"c", 30, 1}};
  JobConfig request = existing;
  request.tensors[1].numel = 21;
  EXPECT_THAT(Differences(existing, request),
              ElementsAre(R"(tensors[1]: {"b", numel 20, param_group 0} )"
                          R"((existing job) vs {"b", numel 21, param_group 0} )"
                          "(this request)"));
}

TEST(JobConfigDiffTest, CountsTheTensorsThatDifferAfterTheFirst) {
  JobConfig existing = BaseJob();
  existing.tensors = {{"a", 10, 0}, {"b", 20, 0}, {"c", 30, 1}, {"d", 1, 1}};
  JobConfig request = existing;
  request.tensors[0].param_group = 1;
  request.tensors[2].name = "x";
  request.tensors[3].numel = 2;
  EXPECT_THAT(Differences(existing, request),
              ElementsAre(R"(tensors[0]: {"a", numel 10, param_group 0} )"
                          R"((existing job) vs {"a", numel 10, param_group 1} )"
                          "(this request), and 2 later tensors differ"));
}

TEST(JobConfigDiffTest, ATensorOnlyOneSideHasShowsAsNone) {
  JobConfig existing = BaseJob();
  JobConfig request = BaseJob();
  request.tensors.push_back({"head", 7, 2});
  EXPECT_THAT(
      Differences(existing, request),
      ElementsAre("number of tensors: 2 (existing job) vs 3 (this request)",
                  R"(tensors[2]: none (existing job) vs {"head", numel 7, )"
                  R"(param_group 2} (this request))"));
}

TEST(JobConfigDiffTest, DescribeJoinsTheLinesForOneMessage) {
  JobConfig request = BaseJob();
  request.num_servers = 2;
  request.chunk_elems = 2048;
  EXPECT_EQ(DescribeJobConfigDifferences(BaseJob(), "existing job", request,
                                         "this request"),
            "chunk_elems: 1024 (existing job) vs 2048 (this request); "
            "num_servers: 3 (existing job) vs 2 (this request)");
}

TEST(OptimizerConfigDiffTest, PrefixesEveryField) {
  OptimizerConfig a;
  OptimizerConfig b;
  b.adam_beta2 = 0.95;
  b.hysteresis = 4;
  EXPECT_THAT(
      OptimizerConfigDifferences("param_groups[1].", a, "saved", b, "loaded"),
      ElementsAre("param_groups[1].adam_beta2: 0.999 (saved) vs 0.95 (loaded)",
                  "param_groups[1].hysteresis: 2 (saved) vs 4 (loaded)"));
}

TEST(JobConfigDiffTest, NamesTheParamGroupWhoseConfigDiffers) {
  JobConfig first = ::depot::testing::BaseJob();
  first.group_optimizers = {first.optimizer, first.optimizer};
  JobConfig second = first;
  second.group_optimizers[1].adam_beta1 = 0.8;
  second.group_optimizers[1].amsgrad = true;
  EXPECT_EQ(JobConfigDifferences(first, "checkpoint", second, "this optimizer"),
            std::vector<std::string>(
                {"group_optimizers[1].adam_beta1: 0.9 (checkpoint) vs 0.8 "
                 "(this optimizer)",
                 "group_optimizers[1].amsgrad: false (checkpoint) vs true "
                 "(this optimizer)"}));
}

}  // namespace
}  // namespace depot
