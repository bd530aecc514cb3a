// A driver of the raw wire protocol (depot::v1::Depot::Stub), for what the
// client library never does: malformed requests, and legal but unusual message
// orders.
#ifndef DEPOT_TESTS_INTEGRATION_RAW_DRIVER_H_
#define DEPOT_TESTS_INTEGRATION_RAW_DRIVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "depot/dtype.h"
#include "depot/job_config.h"
#include "depot/shard_plan.h"
#include "depot/v1/depot.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace depot::testing {

// A stub on a channel that allows 64 MiB messages, like the client's.
std::unique_ptr<v1::Depot::Stub> NewDepotStub(const std::string& address);

// Request headers, every field set.
v1::InitHeader MakeInitHeader(uint64_t job_id, uint64_t fingerprint,
                              v1::DType dtype);
v1::StepHeader MakeStepHeader(
    uint64_t job_id, uint64_t fingerprint, uint64_t step, uint32_t worker_rank,
    const std::vector<GroupHyperParams>& group_hparams);
v1::PullRequest MakePullRequest(uint64_t job_id, uint64_t fingerprint,
                                uint64_t begin, uint64_t end, v1::DType dtype);

// Chunk `index` of `flat` (N elements of `dtype`) as a wire chunk.
v1::Chunk MakeChunk(const ShardPlan& plan, uint64_t index, const void* flat,
                    DType dtype);

// The chunks [first, end) of `flat` in ascending index order.
std::vector<v1::Chunk> MakeChunks(const ShardPlan& plan, uint64_t first,
                                  uint64_t end, const void* flat, DType dtype);

grpc::Status RawCreateJob(v1::Depot::Stub& stub, const v1::JobSpec& spec,
                          uint32_t server_index,
                          v1::CreateJobResponse* response);

grpc::Status RawGetJob(v1::Depot::Stub& stub, uint64_t job_id,
                       bool with_checksum, v1::JobStatus* status);

// Remembers a job's state checksum so a test can show that rejected requests
// left the state exactly as it was. Both calls use gtest assertions: wrap them
// in ASSERT_NO_FATAL_FAILURE.
class StateChecksumWatch {
 public:
  // Reads and remembers the checksum; `status` (optional) gets the whole
  // status.
  void Record(v1::Depot::Stub& stub, uint64_t job_id,
              v1::JobStatus* status = nullptr);
  // Reads the checksum again and expects the remembered one; `status` as above.
  void ExpectUnchanged(v1::Depot::Stub& stub, uint64_t job_id,
                       v1::JobStatus* status = nullptr) const;

 private:
  uint64_t checksum_ = 0;
};

// Sends `header` then `chunks` on one InitWeights stream.
grpc::Status RawInitWeights(v1::Depot::Stub& stub, const v1::InitHeader& header,
                            const std::vector<v1::Chunk>& chunks);

// Pulls [begin, end) and concatenates the payloads in the order they came.
grpc::Status RawPull(v1::Depot::Stub& stub, const v1::PullRequest& request,
                     std::string* payload);

// One Step stream: the messages to send, in order (a header need not come
// first: the server must reject that), and what came back.
struct StepStreamPlan {
  std::vector<v1::StepRequest> messages;
};
struct StepStreamResult {
  grpc::Status status;
  std::vector<v1::Chunk> weights;  // the weight chunks, in arrival order
  std::optional<v1::StepStats> stats;
};

// A plan of a header then `chunks` in the order given.
StepStreamPlan MakeStepPlan(const v1::StepHeader& header,
                            const std::vector<v1::Chunk>& chunks);

// Opens one Step stream per plan, in order, and writes each plan completely
// (ending with a half-close) before opening the next; every stream's answers
// are read concurrently. Returns when every stream has ended, results in plan
// order. The server reads each stream on its own, so a later stream's header
// may be handled before an earlier one's: a test that needs an order waits
// for it in `after_plan(i)`, called once plan i is written (e.g. until the
// server shows the plan's chunks pending).
std::vector<StepStreamResult> RunStepStreams(
    v1::Depot::Stub& stub, const std::vector<StepStreamPlan>& plans,
    absl::Duration timeout = absl::Minutes(2),
    const std::function<void(size_t)>& after_plan = nullptr);

}  // namespace depot::testing

#endif  // DEPOT_TESTS_INTEGRATION_RAW_DRIVER_H_
