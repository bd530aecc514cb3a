// Help output for Depot's programs. Abseil's --help lists the flags of a file
// named after the binary; ours define their flags in files with other names, so
// each program names its own.
#ifndef DEPOT_FLAGS_USAGE_H_
#define DEPOT_FLAGS_USAGE_H_

#include <string>

#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace depot {

// Makes --help and --helpshort list the flags defined in the source file whose
// path ends with `flags_file` (e.g. "server/main.cc"), or, when `flags_file`
// ends with '/', in every file of that directory (e.g. "tests/bench/"), and
// sets the program's usage message. Call once, before absl::ParseCommandLine.
inline void SetFlagsUsage(absl::string_view flags_file,
                          absl::string_view usage_message) {
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [file = std::string(flags_file)](
                                  absl::string_view path) {
    if (absl::EndsWith(file, "/")) return absl::StrContains(path, file);
    return absl::EndsWith(path, file);
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(usage_message);
}

}  // namespace depot

#endif  // DEPOT_FLAGS_USAGE_H_
