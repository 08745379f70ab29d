// The data-plane handshake under attack: the MAC binds every field and the
// direction, and a bounded fuzz run (fixed seed) throws random bytes,
// truncated and bit-flipped hellos, and mutated or forged proofs at a
// PeerListener whose job is waiting for its real peer. Every connection must
// be rejected or closed, never accepted, never left hanging; afterwards the
// real rank still connects.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/random.h"
#include "core/sha256.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/frame.h"
#include "transport/tcp_handshake.h"
#include "transport/tcp_transport.h"
#include "transport/test_socket.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;

TEST(HandshakeMacTest, InputLayoutIsTheDocumentedOne) {
  const Handshake hello{"job", 2, 1, std::string(32, 'd')};
  const std::string want = std::string("trainyard-dial") +
                           std::string("\x03\x00", 2) + "job" +
                           std::string("\x02\x00\x00\x00\x01\x00\x00\x00", 8) +
                           std::string(32, 'd') + std::string(32, 'l');
  EXPECT_EQ(
      HandshakeMacInput(HandshakeRole::kDialer, hello, std::string(32, 'l')),
      want);
  EXPECT_EQ(
      HandshakeMacInput(HandshakeRole::kListener, hello, std::string(32, 'l')),
      "trainyard-accept" + want.substr(14));
  EXPECT_EQ(
      HandshakeMac("s", HandshakeRole::kDialer, hello, std::string(32, 'l')),
      HmacSha256("s", want));
}

// A proof is worthless for another secret, job, rank pair, connection
// (either nonce) or direction.
TEST(HandshakeMacTest, BindsEveryFieldAndTheDirection) {
  const Handshake hello{"job", 2, 1, std::string(32, 'd')};
  const std::string ln(32, 'l');
  const std::string mac = HandshakeMac("s", HandshakeRole::kDialer, hello, ln);
  ASSERT_EQ(mac.size(), kHandshakeMacSize);
  auto with = [&](auto change) {
    Handshake h = hello;
    std::string secret = "s", nonce = ln;
    HandshakeRole role = HandshakeRole::kDialer;
    change(&h, &secret, &nonce, &role);
    return HandshakeMac(secret, role, h, nonce);
  };
  const std::vector<std::string> others = {
      with([](Handshake*, std::string* s, std::string*, HandshakeRole*) {
        *s = "t";
      }),
      with([](Handshake*, std::string* s, std::string*, HandshakeRole*) {
        s->clear();
      }),
      with([](Handshake* h, std::string*, std::string*, HandshakeRole*) {
        h->job_id = "jo";
      }),
      with([](Handshake* h, std::string*, std::string*, HandshakeRole*) {
        h->from_rank = 3;
      }),
      with([](Handshake* h, std::string*, std::string*, HandshakeRole*) {
        h->to_rank = 0;
      }),
      with([](Handshake* h, std::string*, std::string*, HandshakeRole*) {
        h->nonce[31] ^= 1;
      }),
      with([](Handshake*, std::string*, std::string* n, HandshakeRole*) {
        (*n)[0] ^= 0x80;
      }),
      with([](Handshake* h, std::string*, std::string* n, HandshakeRole*) {
        std::swap(h->nonce, *n);
      }),
      with([](Handshake*, std::string*, std::string*, HandshakeRole* r) {
        *r = HandshakeRole::kListener;
      }),
  };
  for (size_t i = 0; i < others.size(); ++i) {
    EXPECT_FALSE(HandshakeMacMatches(mac, others[i])) << "variant " << i;
  }
  EXPECT_TRUE(HandshakeMacMatches(mac, mac));
  EXPECT_FALSE(HandshakeMacMatches(mac, mac.substr(1)));
  EXPECT_FALSE(HandshakeMacMatches(mac, ""));
}

constexpr char kJob[] = "fuzz";
constexpr uint64_t kSeed = 0x7a11ad;
constexpr int kIterations = 2000;
constexpr int kClientThreads = 8;

// How one fuzz connection ended, as its client saw it.
enum class Outcome { kRejected, kClosed, kAccepted, kHung };

// A blocking client socket; every read gives up after 3 s (a hang).
class Client {
 public:
  explicit Client(const std::string& address)
      : fd_(ConnectTestSocket(address, 3)) {}
  ~Client() { ::close(fd_); }
  void Write(const std::string& s) {
    (void)::send(fd_, s.data(), s.size(), MSG_NOSIGNAL);
  }
  void HalfClose() { ::shutdown(fd_, SHUT_WR); }
  // Reads one listener message. *outcome is set when there is none: the
  // connection closed (kClosed), failed to parse (kClosed: the listener
  // does not send garbage, so this would be a reset mid-message) or 3 s
  // passed (kHung).
  bool Read(HandshakeReplyCode* code, std::string* body, Outcome* outcome) {
    const absl::Status s = ReadListenerMessage(fd_, code, body);
    if (s.ok()) return true;
    *outcome = absl::IsDeadlineExceeded(s) ? Outcome::kHung : Outcome::kClosed;
    return false;
  }
  // Reads until the listener decides: a rejection, an accept, the
  // connection closing, or nothing for 3 s.
  Outcome Finish(std::string* reason) {
    HandshakeReplyCode code;
    std::string body;
    Outcome outcome;
    while (Read(&code, &body, &outcome)) {
      if (code == HandshakeReplyCode::kAccepted) return Outcome::kAccepted;
      if (code == HandshakeReplyCode::kRejected) {
        *reason = body;
        // After a rejection the listener closes: EOF (or a reset), not a
        // hang.
        char c;
        const ssize_t n = ::recv(fd_, &c, 1, 0);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
          return Outcome::kHung;
        }
        return Outcome::kRejected;
      }
    }
    return outcome;
  }

 private:
  int fd_ = -1;
};

std::string RandomString(Rng* rng, size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng->Below(256));
  return s;
}

void FlipBits(Rng* rng, std::string* s, int max_flips) {
  if (s->empty()) return;
  const int flips = 1 + static_cast<int>(rng->Below(max_flips));
  for (int i = 0; i < flips; ++i) {
    const uint64_t bit = rng->Below(s->size() * 8);
    (*s)[bit / 8] ^= static_cast<char>(1 << (bit % 8));
  }
}

// Sends a valid hello (rank 1 to rank 0 of kJob) and reads the challenge:
// the listener's nonce, or "" (and *outcome) when none came.
std::string ValidHello(Client* c, Handshake* hello, Outcome* outcome,
                       std::string* reason) {
  *hello = Handshake{kJob, 1, 0, NewHandshakeNonce()};
  c->Write(EncodeHandshake(*hello));
  HandshakeReplyCode code;
  std::string body;
  if (!c->Read(&code, &body, outcome)) return "";
  if (code == HandshakeReplyCode::kChallenge) return body;
  *outcome = code == HandshakeReplyCode::kAccepted ? Outcome::kAccepted
                                                   : Outcome::kRejected;
  *reason = body;
  return "";
}

// One fuzz case against `address`, chosen by `rng`. `secret` is the job's:
// cases use it only to build a correct proof that they then damage.
Outcome RunCase(const std::string& address, const std::string& secret, Rng* rng,
                std::string* reason) {
  Client c(address);
  const std::string valid = EncodeHandshake({kJob, 1, 0, NewHandshakeNonce()});
  Handshake hello;
  Outcome outcome = Outcome::kClosed;
  switch (rng->Below(6)) {
    case 0: {  // random bytes, half of them behind a valid magic and version
      std::string bytes = RandomString(rng, rng->Below(120));
      if (rng->Below(2) == 0) bytes = valid.substr(0, 6) + bytes;
      c.Write(bytes);
      // Now and then leave the connection open: it must time out.
      if (rng->Below(20) != 0) c.HalfClose();
      break;
    }
    case 1:  // a valid hello cut short
      c.Write(valid.substr(0, rng->Below(valid.size())));
      c.HalfClose();
      break;
    case 2: {  // a bit-flipped hello, then a correct proof for the original
      std::string flipped = valid;
      FlipBits(rng, &flipped, 3);
      c.Write(flipped);
      c.HalfClose();
      HandshakeReplyCode code;
      std::string body;
      if (!c.Read(&code, &body, &outcome)) return outcome;
      if (code == HandshakeReplyCode::kAccepted) return Outcome::kAccepted;
      if (code == HandshakeReplyCode::kRejected) {
        *reason = body;
        return Outcome::kRejected;
      }
      // Challenged (the flip left the hello routable): the connection is
      // half-closed, so the listener sees EOF instead of a proof.
      break;
    }
    case 3: {  // a correct proof, bit-flipped or cut short
      const std::string nonce = ValidHello(&c, &hello, &outcome, reason);
      if (nonce.empty()) return outcome;
      std::string proof = EncodeHandshakeProof(
          HandshakeMac(secret, HandshakeRole::kDialer, hello, nonce));
      if (rng->Below(3) == 0) {
        proof.resize(rng->Below(proof.size()));
      } else {
        FlipBits(rng, &proof, 3);
      }
      c.Write(proof);
      c.HalfClose();
      break;
    }
    case 4: {  // random bytes as the proof
      const std::string nonce = ValidHello(&c, &hello, &outcome, reason);
      if (nonce.empty()) return outcome;
      std::string proof = RandomString(rng, rng->Below(80));
      if (rng->Below(2) == 0) {
        proof = EncodeHandshakeProof(RandomString(rng, kHandshakeMacSize));
      }
      c.Write(proof);
      c.HalfClose();
      break;
    }
    case 5: {  // the whole protocol with a wrong secret
      const std::string nonce = ValidHello(&c, &hello, &outcome, reason);
      if (nonce.empty()) return outcome;
      std::string wrong = secret;
      switch (rng->Below(3)) {
        case 0:
          wrong = "";
          break;
        case 1:
          wrong = RandomString(rng, 32);
          break;
        default:
          FlipBits(rng, &wrong, 1);
      }
      c.Write(EncodeHandshakeProof(
          HandshakeMac(wrong, HandshakeRole::kDialer, hello, nonce)));
      break;
    }
  }
  return c.Finish(reason);
}

absl::StatusOr<std::unique_ptr<Transport>> Connect(
    PeerListener* mine, int rank, const std::vector<std::string>& addresses,
    const std::string& secret, absl::Duration timeout) {
  TcpTransportOptions o;
  o.job_id = kJob;
  o.rank = rank;
  o.peer_addresses = addresses;
  o.secret = secret;
  o.connect_timeout = timeout;
  return ConnectTcpTransport(mine, o);
}

TEST(HandshakeFuzzTest, NothingWithoutTheSecretIsAcceptedAndTheJobSurvives) {
  PeerListenerOptions options;
  options.handshake_timeout = absl::Milliseconds(300);
  options.unknown_job_timeout = absl::Milliseconds(100);
  auto l0 = PeerListener::Listen("127.0.0.1:0", options);
  auto l1 = PeerListener::Listen("127.0.0.1:0");
  ASSERT_TRUE(l0.ok() && l1.ok());
  const std::vector<std::string> addresses = {(*l0)->address(),
                                              (*l1)->address()};
  const std::string secret = RandomBytes(32);
  // Rank 0 waits for rank 1 throughout.
  absl::StatusOr<std::unique_ptr<Transport>> t0;
  std::thread rank0([&] {
    t0 = Connect(l0->get(), 0, addresses, secret, absl::Seconds(60));
  });

  const absl::Time start = absl::Now();
  std::vector<std::vector<Outcome>> outcomes(kClientThreads);
  std::vector<std::vector<std::string>> reasons(kClientThreads);
  std::vector<std::thread> clients;
  for (int k = 0; k < kClientThreads; ++k) {
    clients.emplace_back([&, k] {
      Rng rng(kSeed, k);
      for (int i = k; i < kIterations; i += kClientThreads) {
        std::string reason;
        outcomes[k].push_back(RunCase(addresses[0], secret, &rng, &reason));
        reasons[k].push_back(reason);
      }
    });
  }
  for (auto& t : clients) t.join();
  const absl::Duration fuzz_time = absl::Now() - start;

  int rejected = 0, closed = 0, auth_failures = 0;
  for (int k = 0; k < kClientThreads; ++k) {
    for (size_t i = 0; i < outcomes[k].size(); ++i) {
      const std::string where = absl::StrCat("thread ", k, " case ", i);
      ASSERT_NE(outcomes[k][i], Outcome::kAccepted) << where;
      ASSERT_NE(outcomes[k][i], Outcome::kHung)
          << where << " " << reasons[k][i];
      rejected += outcomes[k][i] == Outcome::kRejected;
      closed += outcomes[k][i] == Outcome::kClosed;
      auth_failures += reasons[k][i].find("data-plane authentication failed") !=
                       std::string::npos;
    }
  }
  LOG(INFO) << kIterations << " cases in " << fuzz_time << ": " << rejected
            << " rejected (" << auth_failures << " failed authentication), "
            << closed << " closed";
  EXPECT_EQ(rejected + closed, kIterations);
  EXPECT_GT(auth_failures, kIterations / 10);  // the fuzz reached the proof

  // The listener still serves, and rank 0 is still waiting for its peer.
  const absl::Time real = absl::Now();
  auto t1 = Connect(l1->get(), 1, addresses, secret, absl::Seconds(5));
  rank0.join();
  ASSERT_TRUE(t1.ok()) << t1.status();
  ASSERT_TRUE(t0.ok()) << t0.status();
  EXPECT_LT(absl::Now() - real, absl::Seconds(2));
  Message m;
  m.tensors = {{"x", Tensor::FromVector({1.5f, -2.0f}, {2})}};
  ASSERT_TRUE((*t1)->Send(0, m).ok());
  auto got = (*t0)->Recv(1, absl::Seconds(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->tensors[0].second.data<float>()[1], -2.0f);
}

}  // namespace
}  // namespace trainyard
