#include "server/metrics.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "prometheus/registry.h"

namespace depot {
namespace {

// The value of the series of family `name` whose label `label` is `value`;
// -1 when there is none.
double SeriesValue(prometheus::Registry& registry, const std::string& name,
                   const std::string& label, const std::string& value) {
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != name) continue;
    for (const prometheus::ClientMetric& metric : family.metric) {
      for (const prometheus::ClientMetric::Label& l : metric.label) {
        if (l.name == label && l.value == value) return metric.counter.value;
      }
    }
  }
  return -1;
}

TEST(ServerMetricsTest, LabelledSeriesExistBeforeTheyMove) {
  prometheus::Registry registry;
  ServerMetrics metrics(registry);
  EXPECT_EQ(SeriesValue(registry, "depot_errors_total", "code", "UNAVAILABLE"),
            0.0);
  EXPECT_EQ(SeriesValue(registry, "depot_rpcs_total", "rpc", "pull_weights"),
            0.0);
  EXPECT_EQ(SeriesValue(registry, "depot_received_bytes_total", "rpc", "init"),
            0.0);
}

TEST(ServerMetricsTest, CountErrorIncrementsTheSeriesOfThatCode) {
  prometheus::Registry registry;
  ServerMetrics metrics(registry);
  metrics.CountError(absl::StatusCode::kAborted);
  metrics.CountError(absl::StatusCode::kOk);
  EXPECT_EQ(SeriesValue(registry, "depot_errors_total", "code", "ABORTED"),
            1.0);
  EXPECT_EQ(SeriesValue(registry, "depot_errors_total", "code", "OK"), -1.0);
}

TEST(ServerMetricsTest, CountRpcIncrementsTheSeriesOfThatRpc) {
  prometheus::Registry registry;
  ServerMetrics metrics(registry);
  metrics.CountRpc(Rpc::kDeleteJob);
  EXPECT_EQ(SeriesValue(registry, "depot_rpcs_total", "rpc", "delete_job"),
            1.0);
}

}  // namespace
}  // namespace depot
