#include "observability/prometheus_endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/counter.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;

// Sends `request` (nothing when empty) to 127.0.0.1:`port` over a plain
// socket; the whole response.
std::string Ask(int port, const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  ::inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  if (!request.empty()) {
    EXPECT_EQ(::write(fd, request.data(), request.size()),
              static_cast<ssize_t>(request.size()));
  }
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, n);
  ::close(fd);
  return out;
}

std::string Scrape(int port) {
  return Ask(port, "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
}

TEST(MetricsEndpointTest, ServesRegistryMetricsAndCollectors) {
  auto endpoint = MetricsEndpoint::Start("127.0.0.1:0");
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  ASSERT_GT((*endpoint)->port(), 0);
  auto& family = prometheus::BuildCounter()
                     .Name("test_things_total")
                     .Help("Things.")
                     .Register((*endpoint)->registry());
  family.Add({{"kind", "a"}}).Increment(3);
  int scrapes = 0;
  (*endpoint)->AddCollector([&scrapes] {
    ++scrapes;
    LabeledValues values;
    values.push_back({{{"side", "left"}}, 2.5});
    std::vector<prometheus::MetricFamily> out;
    out.push_back(GaugeFamily("test_level", "A level.", values));
    return out;
  });
  const std::string text = Scrape((*endpoint)->port());
  EXPECT_THAT(text, HasSubstr("200 OK"));
  EXPECT_THAT(text, HasSubstr("test_things_total{kind=\"a\"} 3"));
  EXPECT_THAT(text, HasSubstr("# TYPE test_level gauge"));
  EXPECT_THAT(text, HasSubstr("test_level{side=\"left\"} 2.5"));
  EXPECT_EQ(scrapes, 1);
}

TEST(MetricsEndpointTest, OtherPathsAndGarbageGetClearAnswers) {
  auto endpoint = MetricsEndpoint::Start("127.0.0.1:0");
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  auto ask = [port](const std::string& request) { return Ask(port, request); };
  EXPECT_THAT(ask("GET / HTTP/1.0\r\n\r\n"), HasSubstr("404 Not Found"));
  EXPECT_THAT(ask("\x16\x03\x01garbage\r\n\r\n"), HasSubstr("400 Bad Request"));
  EXPECT_THAT(ask(std::string(8192, 'A')), HasSubstr("400 Bad Request"));
  // A client that says nothing is answered (400) after 2 s, and the
  // endpoint still serves.
  const absl::Time start = absl::Now();
  EXPECT_THAT(ask(""), HasSubstr("400 Bad Request"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
  EXPECT_THAT(Scrape(port), HasSubstr("200 OK"));
  auto bad = MetricsEndpoint::Start("localhost");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MetricsEndpointTest, AnAddressInUseIsAnError) {
  auto first = MetricsEndpoint::Start("127.0.0.1:0");
  ASSERT_TRUE(first.ok());
  const std::string taken = absl::StrCat("127.0.0.1:", (*first)->port());
  auto second = MetricsEndpoint::Start(taken);
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(second.status().message(),
              HasSubstr("metrics: cannot listen on " + taken));
}

}  // namespace
}  // namespace trainyard
