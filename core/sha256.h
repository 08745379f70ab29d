// SHA-256 digests (OpenSSL EVP), as lowercase hex: the checksums the
// checkpoint manifest stores for each stage file (same as `sha256sum`).
//
// Thread-safe: no shared state.
#ifndef TRAINYARD_CORE_SHA256_H_
#define TRAINYARD_CORE_SHA256_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainyard {

// 64 lowercase hex characters. CHECK-fails only if OpenSSL itself fails.
std::string Sha256Hex(absl::string_view data);

// The digest of the file at `path` (streamed, not read whole); errors name the
// path.
absl::StatusOr<std::string> Sha256HexOfFile(const std::string& path);

}  // namespace trainyard

#endif  // TRAINYARD_CORE_SHA256_H_
