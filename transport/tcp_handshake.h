// The proofs of the data-plane handshake (docs/TRANSPORT_FRAME.md,
// "Authentication"): each end of a TCP transport connection proves it holds
// the job's secret with an HMAC-SHA256 over the job id, both ranks, both
// ends' fresh nonces and a label for the direction, so that a proof seen on
// one connection is worthless on any other connection, rank pair or
// direction. The wire messages that carry the nonces and proofs are
// transport/frame.h's; the listener and dialer that exchange them are
// transport/peer_listener.cc and transport/peer_dialer.cc.
//
// Thread-safe: pure functions (NewHandshakeNonce reads OpenSSL's CSPRNG).
#ifndef TRAINYARD_TRANSPORT_TCP_HANDSHAKE_H_
#define TRAINYARD_TRANSPORT_TCP_HANDSHAKE_H_

#include <string>

#include "absl/strings/string_view.h"
#include "transport/frame.h"

namespace trainyard {

// Which end a proof comes from; each has its own label in the MAC input.
enum class HandshakeRole {
  kDialer,    // "trainyard-dial": sent after the listener's challenge
  kListener,  // "trainyard-accept": sent with the accept
};

// The bytes the proofs are computed over: the role's label (ASCII, no
// terminator), u16 job id length, the job id, i32 from_rank, i32 to_rank
// (little-endian), the dialer's nonce (hello.nonce), the listener's nonce;
// each nonce kHandshakeNonceSize bytes (zero-padded or cut like the
// encoder does).
std::string HandshakeMacInput(HandshakeRole role, const Handshake& hello,
                              absl::string_view listener_nonce);

// HMAC-SHA256(secret, HandshakeMacInput(...)), kHandshakeMacSize bytes. An
// empty secret is a valid (public) key: the protocol runs unchanged and
// proves nothing.
std::string HandshakeMac(absl::string_view secret, HandshakeRole role,
                         const Handshake& hello,
                         absl::string_view listener_nonce);

// Whether `got` equals `expected`, in time that does not depend on where
// they differ (CRYPTO_memcmp). False when the sizes differ.
bool HandshakeMacMatches(absl::string_view expected, absl::string_view got);

// A fresh nonce: kHandshakeNonceSize bytes from OpenSSL's CSPRNG.
std::string NewHandshakeNonce();

}  // namespace trainyard

#endif  // TRAINYARD_TRANSPORT_TCP_HANDSHAKE_H_
