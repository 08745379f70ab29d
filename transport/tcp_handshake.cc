#include "transport/tcp_handshake.h"

#include <openssl/crypto.h>

#include <cstdint>
#include <cstring>

#include "core/sha256.h"

namespace trainyard {
namespace {

void PutNonce(std::string* out, absl::string_view nonce) {
  std::string n(nonce.substr(0, kHandshakeNonceSize));
  n.resize(kHandshakeNonceSize, '\0');
  out->append(n);
}

}  // namespace

std::string HandshakeMacInput(HandshakeRole role, const Handshake& hello,
                              absl::string_view listener_nonce) {
  std::string in =
      role == HandshakeRole::kDialer ? "trainyard-dial" : "trainyard-accept";
  AppendLittleEndian<uint16_t>(&in, static_cast<uint16_t>(hello.job_id.size()));
  in.append(hello.job_id);
  AppendLittleEndian<int32_t>(&in, hello.from_rank);
  AppendLittleEndian<int32_t>(&in, hello.to_rank);
  PutNonce(&in, hello.nonce);
  PutNonce(&in, listener_nonce);
  return in;
}

std::string HandshakeMac(absl::string_view secret, HandshakeRole role,
                         const Handshake& hello,
                         absl::string_view listener_nonce) {
  return HmacSha256(secret, HandshakeMacInput(role, hello, listener_nonce));
}

bool HandshakeMacMatches(absl::string_view expected, absl::string_view got) {
  return expected.size() == got.size() &&
         CRYPTO_memcmp(expected.data(), got.data(), got.size()) == 0;
}

std::string NewHandshakeNonce() { return RandomBytes(kHandshakeNonceSize); }

}  // namespace trainyard
