// The Prometheus endpoint: one GET /metrics HTTP endpoint per daemon. Metrics
// and their text format come from prometheus-cpp (Debian's prometheus-cpp-dev:
// its Registry, Counter/Gauge/Histogram and TextSerializer); code updates
// families in registry(), and collectors (AddCollector) report values read
// from live state at scrape time.
//
// The HTTP side is a small server of our own, not prometheus-cpp's
// Exposer: the Exposer runs civetweb, whose threads get a fixed 100 KiB
// stack, and a process linking CUDA's libraries (the worker: cuBLASLt alone
// has 92 KiB of static TLS) cannot create such threads (pthread_create
// fails, and the Exposer throws "null context when constructing
// CivetServer"). Ours answers one connection at a time on its own thread
// (net/poll_server.h's accept loop): a request line and headers of at most
// 8 KiB, read within 2 s; GET /metrics -> 200 text/plain; version=0.0.4,
// another path -> 404, anything else -> 400; then it closes the connection.
//
// Thread safety: registry() families and their metrics are thread-safe
// (prometheus-cpp). AddCollector may be called at any time; collectors run
// on the endpoint's thread.
#ifndef TRAINYARD_OBSERVABILITY_PROMETHEUS_ENDPOINT_H_
#define TRAINYARD_OBSERVABILITY_PROMETHEUS_ENDPOINT_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "net/poll_server.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"

namespace trainyard {

class MetricsEndpoint : private PollServer::Handler {
 public:
  // Serves /metrics on `listen` ("127.0.0.1:0" picks a free port;
  // "0.0.0.0:9090" for pods). InvalidArgument for a malformed address,
  // Unavailable naming it when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& listen);
  ~MetricsEndpoint() override;  // stops serving and joins the thread
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  int port() const { return port_; }
  prometheus::Registry& registry() { return *registry_; }
  void AddCollector(
      std::function<std::vector<prometheus::MetricFamily>()> collect);
  // What a scrape returns now (the exposition text).
  std::string Text();

 private:
  MetricsEndpoint() = default;
  // Answers one connection, then drops it (PollServer::Handler).
  void OnAccept(Fd connection, const sockaddr_in& peer) override;

  std::shared_ptr<prometheus::Registry> registry_ =
      std::make_shared<prometheus::Registry>();
  absl::Mutex mu_;
  std::vector<std::function<std::vector<prometheus::MetricFamily>()>>
      collectors_ ABSL_GUARDED_BY(mu_);
  int port_ = 0;
  // Last: its thread stops before the members above go.
  std::unique_ptr<PollServer> server_;
};

// Families for collectors: one sample per (labels, value).
using LabeledValues =
    std::vector<std::pair<std::map<std::string, std::string>, double>>;
prometheus::MetricFamily GaugeFamily(const std::string& name,
                                     const std::string& help,
                                     const LabeledValues& values);
prometheus::MetricFamily CounterFamily(const std::string& name,
                                       const std::string& help,
                                       const LabeledValues& values);

}  // namespace trainyard

#endif  // TRAINYARD_OBSERVABILITY_PROMETHEUS_ENDPOINT_H_
