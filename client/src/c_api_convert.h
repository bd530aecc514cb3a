// Conversions between the C API's structs (depot/depot.h) and the C++
// client's types (depot/client.h), with the checks that only the C side needs:
// NULL pointers, and enum values that must not wrap when narrowed.
#ifndef DEPOT_CLIENT_SRC_C_API_CONVERT_H_
#define DEPOT_CLIENT_SRC_C_API_CONVERT_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "depot/client.h"
#include "depot/depot.h"

namespace depot::c_api {

// INVALID_ARGUMENT naming the NULL argument `name` of `function`.
absl::Status NullArgument(const char* function, const char* name);

// A DEPOT_DTYPE_* value as a DType; INVALID_ARGUMENT naming `field`
// otherwise.
absl::StatusOr<DType> DTypeField(int32_t value, const char* field);

// INVALID_ARGUMENT for a NULL server address or a timeout that is not a
// finite number of seconds > 0; the rest is left to Client::Connect.
absl::StatusOr<ClientOptions> FromC(const char* const* servers,
                                    size_t num_servers,
                                    const depot_client_options_t& options);

// INVALID_ARGUMENT for NULL strings or tensors, or an enum value out of
// range; the rest is left to Client::OpenJob's validation.
absl::StatusOr<JobConfig> FromC(const depot_job_config_t& config);

depot_optimizer_config_t ToC(const OptimizerConfig& config);

// INVALID_ARGUMENT for NULL group_hparams with num_group_hparams > 0.
absl::StatusOr<StepOptions> FromC(const depot_step_options_t& options);

void ToC(const StepResult& result, depot_step_result_t* out);
// `text` into out[size] (size >= 1), NUL-terminated, cut to fit.
void ToCString(absl::string_view text, char* out, size_t size);

}  // namespace depot::c_api

#endif  // DEPOT_CLIENT_SRC_C_API_CONVERT_H_
