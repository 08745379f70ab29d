// "host:port" strings: split, and resolved to IPv4 socket addresses for
// everything in Trainyard that binds or dials a plain socket (the
// stage-to-stage transport, the /metrics endpoint).
#ifndef TRAINYARD_NET_ADDRESS_H_
#define TRAINYARD_NET_ADDRESS_H_

#include <netinet/in.h>

#include <string>

#include "absl/status/statusor.h"

namespace trainyard {

// "10.0.0.5" of "10.0.0.5:7100", "::1" of "[::1]:7100", "worker-3" of
// "worker-3:7000"; the whole string when it has no port.
std::string HostOfAddress(const std::string& address);

// "10.0.0.5:7000", "0.0.0.0:0" or "worker-3:7000" (resolved to its first
// IPv4 address). InvalidArgument naming `address` when the port is not in
// [0, 65535] or the host does not resolve.
absl::StatusOr<sockaddr_in> ResolveIpv4(const std::string& address);

}  // namespace trainyard

#endif  // TRAINYARD_NET_ADDRESS_H_
