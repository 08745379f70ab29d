// Activation-transfer throughput of TcpTransport over loopback: rank 0
// sends [1024, 1024] float32 activations (4 MiB frames) to rank 1, both
// ranks as threads of this process. tools/bench_transport.sh runs it next
// to iperf3 on the same machine. Also the cost of setting up a connection
// (the authenticated handshake) with and without a job secret.
#include <cstring>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "core/sha256.h"
#include "transport/tcp_handshake.h"
#include "transport/tcp_transport.h"

namespace trainyard {
namespace {

struct Pair {
  std::unique_ptr<PeerListener> l0, l1;
  std::unique_ptr<Transport> t0, t1;
};

std::unique_ptr<Pair> ConnectPair(const std::string& secret = "") {
  auto p = std::make_unique<Pair>();
  p->l0 = *PeerListener::Listen("127.0.0.1:0");
  p->l1 = *PeerListener::Listen("127.0.0.1:0");
  TcpTransportOptions o;
  o.job_id = "bench";
  o.secret = secret;
  o.peer_addresses = {p->l0->address(), p->l1->address()};
  absl::StatusOr<std::unique_ptr<Transport>> t1;
  std::thread other([&] {
    TcpTransportOptions o1 = o;
    o1.rank = 1;
    t1 = ConnectTcpTransport(p->l1.get(), o1);
  });
  auto t0 = ConnectTcpTransport(p->l0.get(), o);
  other.join();
  if (!t0.ok() || !t1.ok()) return nullptr;
  p->t0 = *std::move(t0);
  p->t1 = *std::move(t1);
  return p;
}

// Rows x 1024 float32 per frame; frames in flight before the first Recv.
// Second arg: 1 = the ranks authenticated with a job secret (the frames
// that follow are the same bytes either way: the data plane is not
// encrypted).
void BM_ActivationTransfer(benchmark::State& state) {
  const int64_t rows = state.range(0);
  const int window = 2;
  auto pair = ConnectPair(state.range(1) != 0 ? RandomBytes(32) : "");
  if (pair == nullptr) {
    state.SkipWithError("cannot connect the two ranks over loopback");
    return;
  }
  Tensor x = Tensor::Empty(DType::kFloat32, {rows, 1024});  // [rows, 1024]
  std::memset(x.raw_data(), 0x3c, x.nbytes());
  auto send = [&](int64_t i) {
    Message m;
    m.step = i;
    m.tensors = {{"x", x}};
    return pair->t0->Send(1, std::move(m));
  };
  int64_t sent = 0;
  for (int i = 0; i < window; ++i) (void)send(sent++);
  for (auto _ : state) {
    if (!send(sent++).ok()) {
      state.SkipWithError("send failed");
      break;
    }
    auto m = pair->t1->Recv(0, absl::Seconds(30));
    if (!m.ok()) {
      state.SkipWithError(std::string(m.status().message()).c_str());
      break;
    }
    benchmark::DoNotOptimize(m->tensors[0].second.raw_data());
  }
  for (int i = 0; i < window; ++i) (void)pair->t1->Recv(0, absl::Seconds(30));
  const double bytes = static_cast<double>(state.iterations()) * x.nbytes();
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["GB"] =
      benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsRate);
  state.counters["Gbit"] =
      benchmark::Counter(bytes * 8 / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ActivationTransfer)
    ->ArgNames({"rows", "secret"})
    ->Args({1024, 0})
    ->Args({1024, 1})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// Small-message round trip (latency): one float there and back.
void BM_PingPong(benchmark::State& state) {
  auto pair = ConnectPair();
  if (pair == nullptr) {
    state.SkipWithError("cannot connect the two ranks over loopback");
    return;
  }
  Tensor x = Tensor::FromVector({1.0f}, {1});
  for (auto _ : state) {
    Message m;
    m.tensors = {{"x", x}};
    (void)pair->t0->Send(1, m);
    auto got = pair->t1->Recv(0, absl::Seconds(30));
    (void)pair->t1->Send(0, *std::move(got));
    benchmark::DoNotOptimize(pair->t0->Recv(1, absl::Seconds(30)).ok());
  }
}
BENCHMARK(BM_PingPong)->UseRealTime()->Unit(benchmark::kMicrosecond);

// Connection setup of a 2-rank job over loopback through long-lived
// listeners: both ConnectTcpTransport calls (registration, dial, hello,
// challenge, proof, accept, transport threads), one job id per iteration.
// Tearing the transports down is not timed. Arg: 1 with a 32-byte secret,
// 0 with the empty one (the same protocol: the difference is noise).
void BM_ConnectSetup(benchmark::State& state) {
  auto l0 = PeerListener::Listen("127.0.0.1:0");
  auto l1 = PeerListener::Listen("127.0.0.1:0");
  if (!l0.ok() || !l1.ok()) {
    state.SkipWithError("cannot listen on loopback");
    return;
  }
  TcpTransportOptions o;
  o.peer_addresses = {(*l0)->address(), (*l1)->address()};
  o.secret = state.range(0) != 0 ? RandomBytes(32) : "";
  int64_t job = 0;
  for (auto _ : state) {
    o.job_id = absl::StrCat("setup-", job++);
    absl::StatusOr<std::unique_ptr<Transport>> t1;
    std::thread other([&] {
      TcpTransportOptions o1 = o;
      o1.rank = 1;
      t1 = ConnectTcpTransport(l1->get(), o1);
    });
    auto t0 = ConnectTcpTransport(l0->get(), o);
    other.join();
    if (!t0.ok() || !t1.ok()) {
      state.SkipWithError("connection setup failed");
      break;
    }
    state.PauseTiming();
    t1->reset();
    t0->reset();
    state.ResumeTiming();
  }
}
BENCHMARK(BM_ConnectSetup)
    ->ArgName("secret")
    ->Arg(0)
    ->Arg(1)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// The handshake's cryptography alone: one HMAC-SHA256 proof (each side
// computes two per connection) and one 32-byte nonce from RAND_bytes.
void BM_HandshakeMac(benchmark::State& state) {
  const Handshake hello{"bench-job", 1, 0, NewHandshakeNonce()};
  const std::string secret = RandomBytes(32), nonce = NewHandshakeNonce();
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        HandshakeMac(secret, HandshakeRole::kDialer, hello, nonce));
  }
}
BENCHMARK(BM_HandshakeMac)->Unit(benchmark::kMicrosecond);

void BM_HandshakeNonce(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(NewHandshakeNonce());
}
BENCHMARK(BM_HandshakeNonce)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace trainyard
