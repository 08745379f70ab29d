#include "observability/prometheus_endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdint>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"
#include "net/address.h"
#include "net/socket_io.h"
#include "prometheus/client_metric.h"
#include "prometheus/text_serializer.h"

namespace trainyard {
namespace {

constexpr size_t kMaxRequestBytes = 8 << 10;
constexpr absl::Duration kReadTimeout = absl::Seconds(2);

prometheus::MetricFamily Family(const std::string& name,
                                const std::string& help,
                                prometheus::MetricType type,
                                const LabeledValues& values) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  for (const auto& [labels, value] : values) {
    prometheus::ClientMetric m;
    for (const auto& [k, v] : labels) m.label.push_back({k, v});
    if (type == prometheus::MetricType::Counter) {
      m.counter.value = value;
    } else {
      m.gauge.value = value;
    }
    f.metric.push_back(std::move(m));
  }
  return f;
}

std::string Response(const std::string& status, const std::string& type,
                     const std::string& body) {
  return absl::StrCat("HTTP/1.0 ", status, "\r\nContent-Type: ", type,
                      "\r\nContent-Length: ", body.size(),
                      "\r\nConnection: close\r\n\r\n", body);
}

// Writes the whole response, however long the client takes to read it; a
// client that goes away just loses it.
void Reply(int fd, const std::string& response) {
  WriteString(fd, response, absl::InfiniteFuture(), /*stop_fd=*/-1)
      .IgnoreError();
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& listen) {
  absl::StatusOr<sockaddr_in> resolved = ResolveIpv4(listen);
  if (!resolved.ok()) return Prefixed(resolved.status(), "metrics: ");
  sockaddr_in sa = *resolved;
  SocketCallError failure;
  absl::StatusOr<Fd> fd = ListenTcp(&sa, /*backlog=*/16, &failure);
  if (!fd.ok()) {
    return absl::UnavailableError(
        absl::StrCat("metrics: cannot listen on ", listen, ": ",
                     ErrnoText(failure.error_number)));
  }
  std::unique_ptr<MetricsEndpoint> e(new MetricsEndpoint());
  e->port_ = ntohs(sa.sin_port);
  PollServer::Handler* handler = e.get();
  e->server_ = std::make_unique<PollServer>(
      *std::move(fd), absl::StrCat("metrics ", SockaddrToString(sa)), handler);
  return e;
}

MetricsEndpoint::~MetricsEndpoint() { server_.reset(); }

void MetricsEndpoint::AddCollector(
    std::function<std::vector<prometheus::MetricFamily>()> collect) {
  absl::MutexLock lock(&mu_);
  collectors_.push_back(std::move(collect));
}

std::string MetricsEndpoint::Text() {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  {
    absl::MutexLock lock(&mu_);
    for (const auto& c : collectors_) {
      for (prometheus::MetricFamily& f : c()) families.push_back(std::move(f));
    }
  }
  return prometheus::TextSerializer().Serialize(families);
}

void MetricsEndpoint::OnAccept(Fd connection, const sockaddr_in& peer) {
  const int fd = connection.get();
  // The request line and headers, within kReadTimeout and kMaxRequestBytes.
  std::string req;
  const absl::Time deadline = absl::Now() + kReadTimeout;
  char buf[1024];
  while (!absl::StrContains(req, "\r\n\r\n") &&
         !absl::StrContains(req, "\n\n")) {
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0 || req.size() >= kMaxRequestBytes) {
      Reply(fd, Response("400 Bad Request", "text/plain",
                         "request too slow or too large\n"));
      return;
    }
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    const ssize_t got = ::recv(fd, buf, sizeof(buf), 0);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got <= 0) return;
    req.append(buf, static_cast<size_t>(got));
  }
  if (absl::StartsWith(req, "GET /metrics ") ||
      absl::StartsWith(req, "GET /metrics?")) {
    Reply(fd, Response("200 OK", "text/plain; version=0.0.4", Text()));
  } else if (absl::StartsWith(req, "GET ")) {
    Reply(fd, Response("404 Not Found", "text/plain",
                       "only /metrics is served here\n"));
  } else {
    Reply(fd,
          Response("400 Bad Request", "text/plain", "expected GET /metrics\n"));
  }
}

prometheus::MetricFamily GaugeFamily(const std::string& name,
                                     const std::string& help,
                                     const LabeledValues& values) {
  return Family(name, help, prometheus::MetricType::Gauge, values);
}

prometheus::MetricFamily CounterFamily(const std::string& name,
                                       const std::string& help,
                                       const LabeledValues& values) {
  return Family(name, help, prometheus::MetricType::Counter, values);
}

}  // namespace trainyard
