// SHA-256 digests (OpenSSL EVP), as lowercase hex: the checksums the
// checkpoint manifest stores for each stage file (same as `sha256sum`). Also
// HMAC-SHA256 and cryptographically random bytes, for the data plane's
// authentication (docs/TRANSPORT_FRAME.md) and the job secrets behind it.
//
// Thread-safe: no shared state.
#ifndef TRAINYARD_CORE_SHA256_H_
#define TRAINYARD_CORE_SHA256_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainyard {

// 64 lowercase hex characters. CHECK-fails only if OpenSSL itself fails.
std::string Sha256Hex(absl::string_view data);

// The digest of the file at `path` (streamed, not read whole); errors name the
// path.
absl::StatusOr<std::string> Sha256HexOfFile(const std::string& path);

// Size of an HMAC-SHA256 tag.
inline constexpr size_t kHmacSha256Size = 32;

// HMAC-SHA256 (RFC 2104) of `data` under `key`: 32 raw bytes. Any key length
// works, including empty (which equals a key of one zero byte). CHECK-fails
// only if OpenSSL itself fails.
std::string HmacSha256(absl::string_view key, absl::string_view data);

// `n` bytes from OpenSSL's CSPRNG (RAND_bytes), e.g. nonces and job secrets.
// CHECK-fails only if OpenSSL cannot produce them (no entropy source).
std::string RandomBytes(size_t n);

}  // namespace trainyard

#endif  // TRAINYARD_CORE_SHA256_H_
