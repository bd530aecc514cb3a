// The server's HTTP endpoint on --metrics_listen (deploy/README.md, "Status page"): the
// Prometheus metrics at /metrics, a self-contained status page at /status
// (and /), and the figures it draws at /status.json. One civetweb server
// (Debian's libcivetweb, which prometheus-cpp's Exposer also uses), so that
// the page needs no port of its own.
#ifndef DEPOT_SERVER_STATUS_ENDPOINT_H_
#define DEPOT_SERVER_STATUS_ENDPOINT_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

class CivetServer;

namespace prometheus {
class Registry;
}

namespace depot {

class JobStore;
class ServerMetrics;

// What /status.json reports about the server itself.
struct StatusIdentity {
  std::string listen;          // the gRPC address
  std::string checkpoint_dir;  // empty: no checkpoints
  int threads = 0;
};

class StatusEndpoint {
 public:
  // Serves on `listen` ("host:port"; port 0 picks one). The registry, the
  // metrics and the jobs must outlive the endpoint. UNAVAILABLE when the
  // address cannot be bound, with civetweb's reason.
  static absl::StatusOr<std::unique_ptr<StatusEndpoint>> Start(
      const std::string& listen, std::shared_ptr<prometheus::Registry> registry,
      ServerMetrics* metrics, const JobStore* jobs, StatusIdentity identity);
  ~StatusEndpoint();

  // The port it listens on.
  int port() const { return port_; }

  // The gRPC address once bound (the flag's port may be 0).
  void set_listen(std::string listen) ABSL_LOCKS_EXCLUDED(mu_);

  // The body of /status.json now (also used by tests).
  std::string StatusJson() const;

 private:
  StatusEndpoint() = default;
  class Handler;

  // Sets the memory budget's gauges from the budget, before a scrape: its
  // use moves with every payload, too often to set a gauge each time.
  void RefreshMemoryGauges() const;

  std::shared_ptr<prometheus::Registry> registry_;
  ServerMetrics* metrics_ = nullptr;
  const JobStore* jobs_ = nullptr;
  mutable absl::Mutex mu_;
  StatusIdentity identity_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<CivetServer> server_;
  std::unique_ptr<Handler> handler_;
  int port_ = 0;
};

// The page /status serves: HTML with its script and styles inline (no CDN,
// no library: plain canvas).
extern const char kStatusPageHtml[];

}  // namespace depot

#endif  // DEPOT_SERVER_STATUS_ENDPOINT_H_
