// Fuzz target: request validation, the pure functions the server runs on a
// CreateJob request and on a Step header before it touches any state.
//
// Input: a 2-byte length L, then L bytes of a serialized CreateJobRequest,
// then a serialized StepHeader. The job goes through JobConfigFromProto
// (ValidateJobConfig) and JobShape::Create as CreateJob does; the header,
// against that job's layout and plan (or a small fixed job when the spec is
// invalid), through the checks of a Step stream's first message:
// ValidateGroupHyperParams, ValidateStepNumerics and NodeSender::FromHeader.
// Invariants besides "no crash, no sanitizer report":
//   - every refusal is INVALID_ARGUMENT;
//   - a valid config converts back to a spec that converts to a config with
//     the same fingerprint (the client and the server agree on a job);
//   - the shard of a valid (config, server_index) lies inside the plan, and
//     its state bytes are at least its elements times 4 (or saturated);
//   - a node sender accepts exactly the chunks its partition gives it.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "depot/job_config.h"
#include "depot/v1/depot.pb.h"
#include "server/job_shape.h"
#include "server/node_sender.h"
#include "server/step_hparams.h"
#include "server/step_numerics.h"
#include "tests/fuzz/fuzz_support.h"
#include "wire/wire.h"

namespace {

// DEPOT_FUZZ_VERBOSE=1 prints every refusal (to see what an input reaches).
void CheckRefusal(const absl::Status& s, const char* what) {
  static const bool verbose = std::getenv("DEPOT_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
  DEPOT_FUZZ_CHECK(s.code() == absl::StatusCode::kInvalidArgument, "%s: %s",
                   what, s.ToString().c_str());
}

// A job small enough for any header: 3 tensors, 2 groups, 4 servers.
depot::JobConfig SmallJob() {
  depot::JobConfig config;
  config.name = "fuzz";
  for (uint32_t i = 0; i < 3; ++i) {
    config.tensors.push_back({absl::StrCat("t", i), 100 + 37 * i, i % 2});
  }
  config.num_workers = 2;
  config.chunk_elems = 64;
  config.alignment_elems = 16;
  config.num_servers = 4;
  const absl::Status s = depot::ValidateJobConfig(config);
  DEPOT_FUZZ_CHECK(s.ok(), "the fixed job is invalid: %s",
                   s.ToString().c_str());
  return config;
}

// The Step header's checks, in the order the server runs them.
void CheckHeader(const depot::JobShape& shape,
                 const depot::v1::StepHeader& header) {
  const std::vector<depot::GroupHyperParams> groups =
      depot::GroupHyperParamsFromProto(header);
  if (absl::Status s = depot::ValidateGroupHyperParams(shape.layout(), groups);
      !s.ok()) {
    CheckRefusal(s, "ValidateGroupHyperParams");
  }
  depot::StepNumerics numerics;
  numerics.loss_scale = header.has_loss_scale() ? header.loss_scale() : 1.0;
  numerics.two_phase = header.two_phase();
  if (header.has_commit()) {
    numerics.commit = {header.commit().clip_coef(), header.commit().skip()};
  }
  if (absl::Status s = depot::ValidateStepNumerics(numerics); !s.ok()) {
    CheckRefusal(s, "ValidateStepNumerics");
  } else {
    // What the step's update will multiply the gradients by.
    (void)depot::UnscaleFactor(numerics.loss_scale);
  }
  absl::StatusOr<depot::NodeSender> sender = depot::NodeSender::FromHeader(
      shape.plan(), header.local_ranks(), header.local_rank(),
      header.bucket_chunks());
  if (!sender.ok()) {
    CheckRefusal(sender.status(), "NodeSender::FromHeader");
    return;
  }
  const depot::ShardRange& shard = shape.shard();
  const uint64_t last =
      std::min<uint64_t>(shard.end_chunk, shard.first_chunk + 64);
  for (uint64_t c = shard.first_chunk; c < last; ++c) {
    const absl::Status owns =
        sender->CheckOwns("chunk", c, header.step(), header.worker_rank());
    if (!sender->is_node()) {
      DEPOT_FUZZ_CHECK(owns.ok(),
                       "a one-process worker may not send chunk %llu",
                       static_cast<unsigned long long>(c));
    } else if (!owns.ok()) {
      CheckRefusal(owns, "CheckOwns");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  depot::fuzz::InputReader in(data, size);
  size_t job_bytes = in.U8();
  job_bytes |= size_t{in.U8()} << 8;
  std::string rest = in.Rest();
  if (job_bytes > rest.size()) job_bytes = rest.size();
  depot::v1::CreateJobRequest request;
  depot::v1::StepHeader header;
  const bool request_parsed =
      request.ParseFromString(rest.substr(0, job_bytes));
  const bool header_parsed = header.ParseFromString(rest.substr(job_bytes));

  static const depot::JobConfig* const small_job =
      new depot::JobConfig(SmallJob());
  absl::StatusOr<depot::JobShape> shape =
      depot::JobShape::Create(*small_job, 1);
  DEPOT_FUZZ_CHECK(shape.ok(), "%s", shape.status().ToString().c_str());

  if (request_parsed) {
    absl::StatusOr<depot::JobConfig> config =
        depot::JobConfigFromProto(request.spec());
    if (!config.ok()) {
      CheckRefusal(config.status(), "JobConfigFromProto");
    } else {
      DEPOT_FUZZ_CHECK(depot::ValidateJobConfig(*config).ok(),
                       "JobConfigFromProto returned an invalid config");
      depot::v1::JobSpec again;
      depot::JobConfigToProto(*config, &again);
      absl::StatusOr<depot::JobConfig> back = depot::JobConfigFromProto(again);
      DEPOT_FUZZ_CHECK(back.ok(), "a valid config's spec is refused: %s",
                       back.status().ToString().c_str());
      DEPOT_FUZZ_CHECK(depot::Fingerprint(*back) == depot::Fingerprint(*config),
                       "the fingerprint changes through JobConfigToProto");
      absl::StatusOr<depot::JobShape> job =
          depot::JobShape::Create(*config, request.server_index());
      if (!job.ok()) {
        CheckRefusal(job.status(), "JobShape::Create");
      } else {
        const depot::ShardRange& shard = job->shard();
        DEPOT_FUZZ_CHECK(shard.first_chunk <= shard.end_chunk &&
                             shard.end_chunk <= job->plan().num_chunks() &&
                             shard.begin <= shard.end &&
                             shard.end <= job->plan().total_elems(),
                         "shard outside its plan");
        DEPOT_FUZZ_CHECK(job->state_bytes() / 4 >= shard.size() ||
                             job->state_bytes() == UINT64_MAX,
                         "state bytes %llu for %llu elements",
                         static_cast<unsigned long long>(job->state_bytes()),
                         static_cast<unsigned long long>(shard.size()));
        if (header_parsed) CheckHeader(*job, header);
        return 0;
      }
    }
  }
  if (header_parsed) CheckHeader(*shape, header);
  return 0;
}

std::vector<std::string> DepotFuzzSeeds() {
  std::vector<std::string> seeds;
  depot::v1::JobSpec spec;
  depot::JobConfigToProto(SmallJob(), &spec);
  depot::v1::CreateJobRequest request;
  *request.mutable_spec() = spec;
  request.set_server_index(2);
  const std::string job = request.SerializeAsString();
  auto seed = [&](const std::string& job_bytes,
                  const depot::v1::StepHeader& header) {
    std::string s;
    s.push_back(static_cast<char>(job_bytes.size() & 0xff));
    s.push_back(static_cast<char>(job_bytes.size() >> 8));
    seeds.push_back(s + job_bytes + header.SerializeAsString());
  };
  depot::v1::StepHeader plain;
  plain.set_job_id(1);
  plain.set_step(1);
  seed(job, plain);
  depot::v1::StepHeader node = plain;
  node.set_local_ranks(2);
  node.set_local_rank(1);
  node.set_bucket_chunks(2);
  node.set_loss_scale(1024);
  node.set_two_phase(true);
  depot::v1::GroupHyperParams* g = node.add_group_hparams();
  g->set_param_group(1);
  g->set_lr(0.1);
  g->set_weight_decay(0.01);
  seed(job, node);
  depot::v1::StepHeader commit = plain;
  commit.mutable_commit()->set_clip_coef(0.5);
  commit.set_no_grad_tensors(std::string(1, '\x02'));
  commit.set_sum_only_tensors(std::string(1, '\x01'));
  commit.set_omit_sums(true);
  depot::v1::CreateJobRequest sgd = request;
  sgd.mutable_spec()->mutable_optimizer()->set_kind(depot::v1::OPTIMIZER_SGD);
  sgd.mutable_spec()->mutable_optimizer()->set_sgd_nesterov(true);
  sgd.mutable_spec()->set_num_servers(1);
  sgd.set_server_index(0);
  seed(sgd.SerializeAsString(), commit);
  // Many servers, and past the limit (a plan holds a range per server).
  for (const uint32_t servers :
       {uint32_t{4096}, depot::kMaxServers + 1, uint32_t{20000000}}) {
    depot::v1::CreateJobRequest many = request;
    many.mutable_spec()->set_num_servers(servers);
    many.set_server_index(servers - 1);
    seed(many.SerializeAsString(), plain);
  }
  return seeds;
}
