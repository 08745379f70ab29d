// "host:port" strings as IPv4 socket addresses, for everything in Trainyard
// that binds or dials a plain socket (the stage-to-stage transport, the
// /metrics endpoint).
#ifndef TRAINYARD_NET_IPV4_ADDRESS_H_
#define TRAINYARD_NET_IPV4_ADDRESS_H_

#include <netinet/in.h>

#include <string>

#include "absl/status/statusor.h"

namespace trainyard {

// "10.0.0.5:7000", "0.0.0.0:0" or "worker-3:7000" (resolved to its first
// IPv4 address). InvalidArgument naming `address` when the port is not in
// [0, 65535] or the host does not resolve.
absl::StatusOr<sockaddr_in> ResolveIpv4(const std::string& address);

}  // namespace trainyard

#endif  // TRAINYARD_NET_IPV4_ADDRESS_H_
