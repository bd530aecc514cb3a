// Conversions between the shared C++ types (depot/*.h) and the wire messages
// (depot/v1/depot.proto), and between absl::Status and grpc::Status. Both client and
// server use these, so the two sides cannot disagree about the encoding.
#ifndef DEPOT_COMMON_WIRE_WIRE_H_
#define DEPOT_COMMON_WIRE_WIRE_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "depot/job_config.h"
#include "depot/v1/depot.pb.h"
#include "grpcpp/support/status.h"

namespace depot {

v1::DType DTypeToProto(DType dtype);
// INVALID_ARGUMENT for DTYPE_UNSPECIFIED or an unknown value, naming `field`.
absl::StatusOr<DType> DTypeFromProto(v1::DType dtype, const char* field);

void JobConfigToProto(const JobConfig& config, v1::JobSpec* spec);
// Converts and validates (ValidateJobConfig). INVALID_ARGUMENT with the field named.
absl::StatusOr<JobConfig> JobConfigFromProto(const v1::JobSpec& spec);

void GroupHyperParamsToProto(const std::vector<GroupHyperParams>& groups,
                             v1::StepHeader* header);
std::vector<GroupHyperParams> GroupHyperParamsFromProto(
    const v1::StepHeader& header);

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace depot

#endif  // DEPOT_COMMON_WIRE_WIRE_H_
