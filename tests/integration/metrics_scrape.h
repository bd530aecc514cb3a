// Reading a depot-server's Prometheus endpoint from tests: a plain HTTP/1.0 GET
// over a socket (no HTTP library needed) and a lookup of one series' value in
// the text exposition format.
#ifndef DEPOT_TESTS_INTEGRATION_METRICS_SCRAPE_H_
#define DEPOT_TESTS_INTEGRATION_METRICS_SCRAPE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace depot::testing {

// GET http://<host_port><path>; returns the body of a 200 answer. UNAVAILABLE
// when the connection fails, INTERNAL for any other status line.
absl::StatusOr<std::string> HttpGet(const std::string& host_port,
                                    const std::string& path);

// The body of GET /metrics.
absl::StatusOr<std::string> ScrapeMetrics(const std::string& host_port);

// The value of `series` in `exposition`, where series is the name followed by
// its labels exactly as the server prints them, e.g.
// `depot_rpcs_total{rpc="step"}` or `depot_jobs`. NOT_FOUND if no sample line
// has it.
absl::StatusOr<double> MetricValue(absl::string_view exposition,
                                   absl::string_view series);

// Scrapes until `series` is at least `value` or `timeout` passes
// (DEADLINE_EXCEEDED). For tests that must know the server has reached a state
// (e.g. "holds a contribution") that no RPC reports; it waits on that
// condition, not on a guess of how long the server needs.
absl::Status WaitForMetricAtLeast(const std::string& host_port,
                                  absl::string_view series, double value,
                                  absl::Duration timeout);

// The same, until `series` is at most `value` (e.g. depot_active_streams
// falling to 0: a stream stops counting only once the server has released it,
// which may be just after the client has its final status).
absl::Status WaitForMetricAtMost(const std::string& host_port,
                                 absl::string_view series, double value,
                                 absl::Duration timeout);

}  // namespace depot::testing

#endif  // DEPOT_TESTS_INTEGRATION_METRICS_SCRAPE_H_
