#include "observability/metrics.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "net/address.h"
#include "core/status_macros.h"
#include "glog/logging.h"
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

void WriteAll(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    const ssize_t n =
        ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the client went away; nothing to do
    off += static_cast<size_t>(n);
  }
}

std::string Response(const std::string& status, const std::string& type,
                     const std::string& body) {
  return absl::StrCat("HTTP/1.0 ", status, "\r\nContent-Type: ", type,
                      "\r\nContent-Length: ", body.size(),
                      "\r\nConnection: close\r\n\r\n", body);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& listen) {
  absl::StatusOr<sockaddr_in> resolved = ResolveIpv4(listen);
  if (!resolved.ok()) return Prefixed(resolved.status(), "metrics: ");
  sockaddr_in sa = *resolved;
  std::unique_ptr<MetricsEndpoint> e(new MetricsEndpoint());
  e->listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  ::setsockopt(e->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (e->listen_fd_ < 0 ||
      ::bind(e->listen_fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) !=
          0 ||
      ::listen(e->listen_fd_, 16) != 0 || ::pipe2(e->wake_, O_CLOEXEC) != 0) {
    return absl::UnavailableError(absl::StrCat(
        "metrics: cannot listen on ", listen, ": ", std::strerror(errno)));
  }
  socklen_t len = sizeof(sa);
  ::getsockname(e->listen_fd_, reinterpret_cast<sockaddr*>(&sa), &len);
  e->port_ = ntohs(sa.sin_port);
  e->thread_ = std::thread([raw = e.get()] { raw->Serve(); });
  return e;
}

MetricsEndpoint::~MetricsEndpoint() {
  if (wake_[1] >= 0) {
    const char b = 0;
    (void)!::write(wake_[1], &b, 1);
  }
  if (thread_.joinable()) thread_.join();
  for (int fd : {listen_fd_, wake_[0], wake_[1]}) {
    if (fd >= 0) ::close(fd);
  }
}

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

void MetricsEndpoint::Serve() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    const int n = ::poll(fds, 2, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 || (fds[1].revents & POLLIN)) return;
    const int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;
    Answer(c);
    ::close(c);
  }
}

void MetricsEndpoint::Answer(int fd) {
  // The request line and headers, within kReadTimeout and kMaxRequestBytes.
  std::string req;
  const absl::Time deadline = absl::Now() + kReadTimeout;
  char buf[1024];
  while (!absl::StrContains(req, "\r\n\r\n") &&
         !absl::StrContains(req, "\n\n")) {
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0 || req.size() >= kMaxRequestBytes) {
      WriteAll(fd, Response("400 Bad Request", "text/plain",
                            "request too slow or too large\n"));
      return;
    }
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    const ssize_t got = ::recv(fd, buf, sizeof(buf), 0);
    if (got <= 0) return;
    req.append(buf, static_cast<size_t>(got));
  }
  if (absl::StartsWith(req, "GET /metrics ") ||
      absl::StartsWith(req, "GET /metrics?")) {
    WriteAll(fd, Response("200 OK", "text/plain; version=0.0.4", Text()));
  } else if (absl::StartsWith(req, "GET ")) {
    WriteAll(fd, Response("404 Not Found", "text/plain",
                          "only /metrics is served here\n"));
  } else {
    WriteAll(fd, Response("400 Bad Request", "text/plain",
                          "expected GET /metrics\n"));
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
