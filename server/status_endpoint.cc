#include "server/status_endpoint.h"

#include <CivetServer.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "depot/json_text.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "server/job_store.h"
#include "server/metrics.h"
#include "server/shard_state.h"

namespace depot {
namespace {

void Send(mg_connection* connection, const char* type,
          const std::string& body) {
  mg_printf(connection,
            "HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
            "Cache-Control: no-store\r\nConnection: close\r\n\r\n",
            type, body.size());
  mg_write(connection, body.data(), body.size());
}

}  // namespace

class StatusEndpoint::Handler : public CivetHandler {
 public:
  explicit Handler(const StatusEndpoint* endpoint) : endpoint_(endpoint) {}

  bool handleGet(CivetServer*, mg_connection* connection) override {
    const mg_request_info* request = mg_get_request_info(connection);
    const std::string uri = request->local_uri ? request->local_uri : "";
    if (uri == "/metrics") {
      endpoint_->RefreshMemoryGauges();
      Send(connection, "text/plain; version=0.0.4; charset=utf-8",
           prometheus::TextSerializer().Serialize(
               endpoint_->registry_->Collect()));
    } else if (uri == "/status.json") {
      Send(connection, "application/json", endpoint_->StatusJson());
    } else if (uri == "/" || uri == "/status") {
      Send(connection, "text/html; charset=utf-8", kStatusPageHtml);
    } else {
      const std::string body =
          "not found: this endpoint serves /metrics, /status and "
          "/status.json\n";
      mg_printf(connection,
                "HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\n"
                "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                body.size());
      mg_write(connection, body.data(), body.size());
    }
    return true;
  }

 private:
  const StatusEndpoint* endpoint_;
};

absl::StatusOr<std::unique_ptr<StatusEndpoint>> StatusEndpoint::Start(
    const std::string& listen, std::shared_ptr<prometheus::Registry> registry,
    ServerMetrics* metrics, const JobStore* jobs, StatusIdentity identity) {
  std::unique_ptr<StatusEndpoint> endpoint(new StatusEndpoint());
  endpoint->registry_ = std::move(registry);
  endpoint->metrics_ = metrics;
  endpoint->jobs_ = jobs;
  {
    absl::MutexLock lock(&endpoint->mu_);
    endpoint->identity_ = std::move(identity);
  }
  const std::vector<std::string> options = {
      "listening_ports", listen, "num_threads", "2",
      // A scrape or a page that stalls must not hold a thread for long.
      "request_timeout_ms", "10000"};
  try {
    endpoint->server_ = std::make_unique<CivetServer>(options);
  } catch (const CivetException& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics and status on ", listen, ": ",
                     e.what()));
  }
  endpoint->handler_ = std::make_unique<Handler>(endpoint.get());
  endpoint->server_->addHandler("/", endpoint->handler_.get());
  const std::vector<int> ports = endpoint->server_->getListeningPorts();
  endpoint->port_ = ports.empty() ? 0 : ports.front();
  return endpoint;
}

StatusEndpoint::~StatusEndpoint() {
  if (server_ != nullptr) server_->close();  // before the handler goes
}

void StatusEndpoint::RefreshMemoryGauges() const {
  metrics_->memory_limit_bytes.Set(
      static_cast<double>(jobs_->budget()->limit()));
  metrics_->memory_used_bytes.Set(static_cast<double>(jobs_->budget()->used()));
}

void StatusEndpoint::set_listen(std::string listen) {
  absl::MutexLock lock(&mu_);
  identity_.listen = std::move(listen);
}

std::string StatusEndpoint::StatusJson() const {
  StatusIdentity identity;
  {
    absl::MutexLock lock(&mu_);
    identity = identity_;
  }
  const auto now = std::chrono::system_clock::now();
  const double unix_now =
      std::chrono::duration<double>(now.time_since_epoch()).count();
  std::string out = "{";
  absl::StrAppend(&out, "\"time\":", JsonNumber(unix_now), ",\"server\":{",
                  "\"listen\":", JsonString(identity.listen),
                  ",\"checkpoint_dir\":", JsonString(identity.checkpoint_dir),
                  ",\"threads\":", identity.threads,
                  ",\"start_time\":", JsonNumber(metrics_->start_time.Value()),
                  ",\"memory_limit_bytes\":", jobs_->memory_limit_bytes(),
                  ",\"memory_used_bytes\":", jobs_->budget()->used(),
                  ",\"state_bytes\":", jobs_->state_bytes(),
                  ",\"checkpoint_every_steps\":",
                  JsonNumber(metrics_->checkpoint_every_steps.Value()),
                  ",\"checkpoint_last_success\":",
                  JsonNumber(metrics_->checkpoint_last_success.Value()), "}");
  // Counters: the page turns them into rates between two polls.
  absl::StrAppend(
      &out, ",\"counters\":{",
      "\"steps_completed\":", JsonNumber(metrics_->steps_completed.Value()),
      ",\"chunks_updated\":", JsonNumber(metrics_->chunks_updated.Value()),
      ",\"received_bytes\":",
      JsonNumber(metrics_->received_step_bytes.Value() +
             metrics_->received_init_bytes.Value()),
      ",\"sent_bytes\":",
      JsonNumber(metrics_->sent_step_bytes.Value() +
             metrics_->sent_pull_bytes.Value()),
      ",\"checkpoints_written\":",
      JsonNumber(metrics_->checkpoints_written.Value()),
      ",\"checkpoint_failures\":",
      JsonNumber(metrics_->checkpoint_failures.Value()),
      ",\"rollbacks\":", JsonNumber(metrics_->rollbacks.Value()),
      ",\"jobs_restored\":", JsonNumber(metrics_->jobs_restored.Value()),
      ",\"step_stalls\":", JsonNumber(metrics_->step_stalls.Value()), "}");
  absl::StrAppend(&out, ",\"gauges\":{",
                  "\"active_streams\":",
                  JsonNumber(metrics_->active_streams.Value()),
                  ",\"stalled_steps\":",
                  JsonNumber(metrics_->stalled_steps.Value()), "}");
  // The step latency histogram's sum and count: mean latency between polls.
  prometheus::ClientMetric step_seconds = metrics_->step_seconds.Collect();
  absl::StrAppend(&out, ",\"step_seconds\":{\"sum\":",
                  JsonNumber(step_seconds.histogram.sample_sum), ",\"count\":",
                  step_seconds.histogram.sample_count, "}");
  std::vector<std::string> jobs;
  for (const std::shared_ptr<ShardState>& shard : jobs_->Jobs()) {
    const JobShape& shape = shard->shape();
    const PendingStepReport pending = shard->OldestPendingStep();
    const double waiting =
        pending.step == 0
            ? 0.0
            : std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                            pending.since)
                  .count();
    jobs.push_back(absl::StrCat(
        "{\"id\":", shard->job_id(),
        ",\"name\":", JsonString(shape.config().name), ",\"tenant\":",
        JsonString(shape.tenant()), ",\"server_index\":", shape.server_index(),
        ",\"num_servers\":", shape.config().num_servers, ",\"num_workers\":",
        shape.config().num_workers, ",\"step\":", shard->completed_step(),
        ",\"newest_step\":", shard->newest_step(),
        ",\"pending_step\":", pending.step, ",\"missing_workers\":[",
        absl::StrJoin(pending.missing_workers, ","), "]",
        ",\"waiting_seconds\":", JsonNumber(waiting), ",\"shard_params\":",
        shape.shard().size(), ",\"state_bytes\":", shape.state_bytes(), "}"));
  }
  absl::StrAppend(&out, ",\"jobs\":[", absl::StrJoin(jobs, ","), "]}");
  return out;
}

}  // namespace depot
