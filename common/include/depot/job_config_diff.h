// JobConfigDifferences: what differs between two job configs, field by field,
// in words a person can act on. Two configs whose fingerprints differ have at
// least one difference here; the messages that reject a config (a job of the
// same name with another config, a checkpoint of another job) list them
// instead of two opaque hashes.
//
//   JobConfigDifferences(existing, "existing job", request, "this request")
//   -> {"optimizer.lr: 0.001 (existing job) vs 0.0003 (this request)",
//       "grad_dtype: bf16 (existing job) vs fp32 (this request)"}
#ifndef DEPOT_JOB_CONFIG_DIFF_H_
#define DEPOT_JOB_CONFIG_DIFF_H_

#include <string>
#include <string_view>
#include <vector>

#include "depot/job_config.h"

namespace depot {

// One line per differing field, in the order of JobConfig's fields, each
// "FIELD: VALUE (first_label) vs VALUE (second_label)". Optimizer fields are
// named "optimizer.FIELD". The tensor lists are compared as a whole: their
// counts ("tensors: 12 (first) vs 13 (second)") and the first index at which
// they differ, with that tensor's name, numel and param group on each side
// (and how many more indices differ). Floating-point fields compare as the
// fingerprint does (bit for bit) and print as the shortest decimal that reads
// back as the same double. Empty when the configs are equal.
std::vector<std::string> JobConfigDifferences(const JobConfig& first,
                                              std::string_view first_label,
                                              const JobConfig& second,
                                              std::string_view second_label);

// The same for two optimizer configs, with every field name prefixed by
// `prefix` (e.g. "optimizer." or "param_groups[1].optimizer.").
std::vector<std::string> OptimizerConfigDifferences(
    std::string_view prefix, const OptimizerConfig& first,
    std::string_view first_label, const OptimizerConfig& second,
    std::string_view second_label);

// JobConfigDifferences joined with "; ", for one-line error messages; empty
// when nothing differs (a caller that found the fingerprints different should
// then print those).
std::string DescribeJobConfigDifferences(const JobConfig& first,
                                         std::string_view first_label,
                                         const JobConfig& second,
                                         std::string_view second_label);

}  // namespace depot

#endif  // DEPOT_JOB_CONFIG_DIFF_H_
