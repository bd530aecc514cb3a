// One result line of depot-bench: named numeric fields printed either as a
// human-readable table row or as one JSON object (docs/performance.md lists
// the keys of each subcommand); and the statistics every subcommand takes.
#ifndef DEPOT_TESTS_BENCH_BENCH_OUTPUT_H_
#define DEPOT_TESTS_BENCH_BENCH_OUTPUT_H_

#include <sys/types.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "depot/json_text.h"

namespace depot::bench {

// The median of `values` (the mean of the middle two for an even count).
// REQUIRES: values is not empty.
inline double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// CPU seconds (user + system, every thread, exited ones included) process
// `pid` has used so far; 0 when it cannot be read.
inline double ProcessCpuSeconds(pid_t pid) {
  clockid_t clock;
  timespec time;
  if (clock_getcpuclockid(pid, &clock) != 0 || clock_gettime(clock, &time) != 0)
    return 0;
  return static_cast<double>(time.tv_sec) + time.tv_nsec * 1e-9;
}

using ::depot::JsonString;  // depot/json_text.h

struct ResultLine {
  std::string bench;  // the subcommand, e.g. "kernel"
  std::vector<std::pair<std::string, std::string>> text;  // string fields
  std::vector<std::pair<std::string, double>> numbers;    // numeric fields

  // Prints the line to stdout: `json` gives one JSON object with "bench" and
  // every field; otherwise "key: value" pairs, one per line, under a header.
  void Print(bool json) const {
    if (json) {
      std::string out = absl::StrCat("{\"bench\": ", JsonString(bench));
      for (const auto& [key, value] : text)
        absl::StrAppend(&out, ", ", JsonString(key), ": ", JsonString(value));
      for (const auto& [key, value] : numbers)
        absl::StrAppend(&out, ", ", JsonString(key), ": ",
                        absl::StrFormat("%.10g", value));
      std::printf("%s}\n", out.c_str());
    } else {
      std::printf("== %s\n", bench.c_str());
      for (const auto& [key, value] : text)
        std::printf("  %-24s %s\n", key.c_str(), value.c_str());
      for (const auto& [key, value] : numbers)
        std::printf("  %-24s %.10g\n", key.c_str(), value);
    }
    std::fflush(stdout);
  }
};

}  // namespace depot::bench

#endif  // DEPOT_TESTS_BENCH_BENCH_OUTPUT_H_
