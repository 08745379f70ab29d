#include "transport/tcp_transport.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"
#include "glog/logging.h"
#include "net/socket_io.h"
#include "transport/frame.h"
#include "transport/peer_dialer.h"
#include "transport/socket_transport.h"

namespace trainyard {
namespace {

// Connection setup looks at TcpTransportOptions::cancel this often.
constexpr absl::Duration kCancelPollInterval = absl::Milliseconds(50);

bool CancelRequested(const TcpTransportOptions& options) {
  return options.cancel != nullptr && options.cancel->load();
}

// InvalidArgument, starting with `me`, for options no transport can use.
absl::Status ValidateOptions(const TcpTransportOptions& options,
                             const std::string& me) {
  const int world = static_cast<int>(options.peer_addresses.size());
  if (options.job_id.empty() ||
      options.job_id.size() > static_cast<size_t>(kMaxJobIdLength)) {
    return absl::InvalidArgumentError(
        absl::StrCat(me, ": job id must be 1..", kMaxJobIdLength, " bytes"));
  }
  if (options.rank < 0 || options.rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat(me, ": rank not in [0, ", world, ") (peer_addresses has ",
                     world, " entries)"));
  }
  if (options.keepalive_idle < absl::Seconds(1) ||
      options.keepalive_interval < absl::Seconds(1) ||
      options.keepalive_count < 1 ||
      options.keepalive_idle > absl::Seconds(32767) ||
      options.keepalive_interval > absl::Seconds(32767) ||
      options.keepalive_count > 127) {
    return absl::InvalidArgumentError(absl::StrCat(
        me,
        ": keepalive_idle and keepalive_interval must be in [1s, 32767s] "
        "and keepalive_count in [1, 127], got ",
        absl::FormatDuration(options.keepalive_idle), ", ",
        absl::FormatDuration(options.keepalive_interval), ", ",
        options.keepalive_count));
  }
  if (options.tcp_user_timeout < absl::ZeroDuration() ||
      options.tcp_user_timeout > absl::Milliseconds(INT32_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat(
        me, ": tcp_user_timeout must be >= 0 and fit in int32 ms, got ",
        absl::FormatDuration(options.tcp_user_timeout)));
  }
  return absl::OkStatus();
}

// Keepalive and user timeout from `options` (validated) on a connection.
absl::Status SetLivenessOptions(int fd, const TcpTransportOptions& options) {
  const int on = 1;
  const int idle =
      static_cast<int>(absl::ToInt64Seconds(options.keepalive_idle));
  const int interval =
      static_cast<int>(absl::ToInt64Seconds(options.keepalive_interval));
  const int count = options.keepalive_count;
  const unsigned int user_timeout = static_cast<unsigned int>(
      absl::ToInt64Milliseconds(options.tcp_user_timeout));
  struct {
    int level, name;
    const void* value;
    const char* what;
  } const settings[] = {
      {SOL_SOCKET, SO_KEEPALIVE, &on, "SO_KEEPALIVE"},
      {IPPROTO_TCP, TCP_KEEPIDLE, &idle, "TCP_KEEPIDLE"},
      {IPPROTO_TCP, TCP_KEEPINTVL, &interval, "TCP_KEEPINTVL"},
      {IPPROTO_TCP, TCP_KEEPCNT, &count, "TCP_KEEPCNT"},
      {IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, "TCP_USER_TIMEOUT"},
  };
  for (const auto& o : settings) {
    if (o.name == TCP_USER_TIMEOUT && user_timeout == 0) continue;
    if (::setsockopt(fd, o.level, o.name, o.value, sizeof(int)) != 0) {
      return absl::InternalError(
          absl::StrCat("setsockopt ", o.what, ": ", ErrnoText(errno)));
    }
  }
  return absl::OkStatus();
}

// One rank's connections being set up: threads of its own dial every lower
// rank in parallel, while the listener takes the higher ranks' connections
// into the registration.
class MeshConnect {
 public:
  MeshConnect(const TcpTransportOptions& options,
              std::shared_ptr<PeerRegistration> reg, absl::Time deadline)
      : options_(options),
        reg_(std::move(reg)),
        deadline_(deadline),
        dialing_(options.rank) {
    for (int r = 0; r < options_.rank; ++r) {
      dialed_.emplace_back(absl::UnknownError("not dialed"));
    }
    for (int r = 0; r < options_.rank; ++r) {
      dialers_.emplace_back([this, r] { DialRank(r); });
    }
  }
  ~MeshConnect() { JoinDialers(); }

  // Waits until every dial is done and every higher rank is in, the
  // deadline passes, or the cancel flag is set (polled, since nothing
  // signals it). True when the cancel came first: the dialers are told to
  // stop.
  bool AwaitPeersOrCancel();
  void JoinDialers();
  // Every connection by rank (ours empty), or DeadlineExceeded starting
  // with `me` and naming each missing rank and why.
  absl::StatusOr<std::vector<Fd>> TakeConnections(const std::string& me);

 private:
  void DialRank(int r) {
    dialed_[r] = DialPeer(options_.peer_addresses[r],
                          Handshake{options_.job_id, options_.rank, r},
                          options_.secret, deadline_, stop_dialing_.fd());
    absl::MutexLock lock(&reg_->mu);
    --dialing_;
  }

  bool AllIn() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(reg_->mu) {
    if (dialing_ > 0) return false;
    for (int r = options_.rank + 1; r < static_cast<int>(reg_->accepted.size());
         ++r) {
      if (!reg_->accepted[r].valid()) return false;
    }
    return true;
  }

  const TcpTransportOptions& options_;
  const std::shared_ptr<PeerRegistration> reg_;
  const absl::Time deadline_;
  PollSignal stop_dialing_;  // cuts the dialers short on a cancel
  // By lower rank; each written by its dialer, read once it is joined.
  std::vector<absl::StatusOr<Fd>> dialed_;
  int dialing_ ABSL_GUARDED_BY(reg_->mu);
  std::vector<std::thread> dialers_;
};

bool MeshConnect::AwaitPeersOrCancel() {
  bool cancelled = false;
  {
    absl::MutexLock lock(&reg_->mu);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(reg_->mu) {
      return AllIn() || CancelRequested(options_);
    };
    while (!done() && absl::Now() < deadline_) {
      reg_->mu.AwaitWithDeadline(
          absl::Condition(&done),
          std::min(deadline_, absl::Now() + kCancelPollInterval));
    }
    cancelled = !AllIn() && CancelRequested(options_);
  }
  if (cancelled) stop_dialing_.Signal();
  return cancelled;
}

void MeshConnect::JoinDialers() {
  for (auto& t : dialers_) {
    if (t.joinable()) t.join();
  }
}

absl::StatusOr<std::vector<Fd>> MeshConnect::TakeConnections(
    const std::string& me) {
  const int world = static_cast<int>(options_.peer_addresses.size());
  std::vector<Fd> fds(world);
  std::vector<std::string> missing;
  for (int r = 0; r < options_.rank; ++r) {
    if (dialed_[r].ok()) {
      fds[r] = *std::move(dialed_[r]);
    } else {
      missing.push_back(absl::StrCat("rank ", r, " (",
                                     options_.peer_addresses[r],
                                     "): ", dialed_[r].status().message()));
    }
  }
  {
    absl::MutexLock lock(&reg_->mu);
    for (int r = options_.rank + 1; r < world; ++r) {
      if (reg_->accepted[r].valid()) {
        fds[r] = std::move(reg_->accepted[r]);
      } else {
        missing.push_back(absl::StrCat("rank ", r, " (",
                                       options_.peer_addresses[r],
                                       "): never connected"));
      }
    }
  }
  if (!missing.empty()) {
    return absl::DeadlineExceededError(
        absl::StrCat(me, ": peers not connected within ",
                     absl::FormatDuration(options_.connect_timeout), ": ",
                     absl::StrJoin(missing, "; ")));
  }
  return fds;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> ConnectTcpTransport(
    PeerListener* listener, const TcpTransportOptions& options) {
  const std::string me =
      absl::StrCat("job \"", options.job_id, "\" rank ", options.rank);
  RETURN_IF_ERROR(ValidateOptions(options, me));
  auto* registering = dynamic_cast<RegisteringPeerListener*>(listener);
  if (registering == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(me, ": listener was not made by PeerListener::Listen"));
  }
  const absl::Status cancelled =
      absl::CancelledError(absl::StrCat(me, ": connection setup cancelled"));
  if (CancelRequested(options)) return cancelled;
  ASSIGN_OR_RETURN(
      std::shared_ptr<PeerRegistration> reg,
      registering->Register(options.job_id, options.rank,
                            static_cast<int>(options.peer_addresses.size()),
                            options.secret));
  // Higher ranks dial us; we dial the lower ones.
  MeshConnect mesh(options, reg, absl::Now() + options.connect_timeout);
  const bool was_cancelled = mesh.AwaitPeersOrCancel();
  mesh.JoinDialers();
  registering->Unregister(reg);
  if (was_cancelled) {
    LOG(INFO) << me << ": connection setup cancelled";
    return cancelled;
  }
  ASSIGN_OR_RETURN(std::vector<Fd> fds, mesh.TakeConnections(me));
  for (size_t r = 0; r < fds.size(); ++r) {
    if (static_cast<int>(r) == options.rank) continue;
    const absl::Status s = SetLivenessOptions(fds[r].get(), options);
    if (!s.ok()) {
      return absl::InternalError(absl::StrCat(me, ": connection to rank ", r,
                                              " (", options.peer_addresses[r],
                                              "): ", s.message()));
    }
  }
  return NewSocketTransport({options.job_id, options.rank,
                             options.peer_addresses, options.io_timeout},
                            std::move(fds));
}

}  // namespace trainyard
