#include "core/sha256.h"

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace trainyard {
namespace {

struct CtxDeleter {
  void operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }
};
using CtxPtr = std::unique_ptr<EVP_MD_CTX, CtxDeleter>;

CtxPtr NewSha256Ctx() {
  CtxPtr ctx(EVP_MD_CTX_new());
  CHECK(ctx != nullptr) << "EVP_MD_CTX_new failed";
  CHECK_EQ(EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr), 1);
  return ctx;
}

std::string Finish(EVP_MD_CTX* ctx) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  CHECK_EQ(EVP_DigestFinal_ex(ctx, digest, &len), 1);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), len));
}

}  // namespace

std::string Sha256Hex(absl::string_view data) {
  CtxPtr ctx = NewSha256Ctx();
  CHECK_EQ(EVP_DigestUpdate(ctx.get(), data.data(), data.size()), 1);
  return Finish(ctx.get());
}

absl::StatusOr<std::string> Sha256HexOfFile(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"),
                                          &std::fclose);
  if (f == nullptr) {
    std::string msg =
        absl::StrCat(path, ": cannot open: ", std::strerror(errno));
    return errno == ENOENT ? absl::NotFoundError(msg)
                           : absl::InternalError(msg);
  }
  CtxPtr ctx = NewSha256Ctx();
  std::unique_ptr<char[]> buf(new char[1 << 20]);
  for (;;) {
    size_t n = std::fread(buf.get(), 1, 1 << 20, f.get());
    if (n > 0) CHECK_EQ(EVP_DigestUpdate(ctx.get(), buf.get(), n), 1);
    if (n < (1u << 20)) {
      if (std::ferror(f.get())) {
        return absl::InternalError(absl::StrCat(path, ": read failed"));
      }
      break;
    }
  }
  return Finish(ctx.get());
}

std::string HmacSha256(absl::string_view key, absl::string_view data) {
  unsigned char tag[kHmacSha256Size];
  size_t len = 0;
  // Never a null pointer: an empty string_view may have data() == nullptr.
  static const char kNone[1] = {0};
  const unsigned char* in = reinterpret_cast<const unsigned char*>(
      data.empty() ? kNone : data.data());
  CHECK(EVP_Q_mac(/*libctx=*/nullptr, "HMAC", /*propq=*/nullptr, "SHA256",
                  /*params=*/nullptr, key.empty() ? kNone : key.data(),
                  key.size(), in, data.size(), tag, sizeof(tag),
                  &len) != nullptr)
      << "EVP_Q_mac(HMAC-SHA256) failed: "
      << ERR_error_string(ERR_get_error(), nullptr);
  CHECK_EQ(len, kHmacSha256Size);
  return std::string(reinterpret_cast<const char*>(tag), len);
}

std::string RandomBytes(size_t n) {
  std::string out(n, '\0');
  // RAND_bytes takes an int count.
  constexpr size_t kPiece = size_t{1} << 30;
  for (size_t done = 0; done < n; done += kPiece) {
    const size_t take = std::min(kPiece, n - done);
    CHECK_EQ(RAND_bytes(reinterpret_cast<unsigned char*>(&out[done]),
                        static_cast<int>(take)),
             1)
        << "RAND_bytes(" << take
        << ") failed: " << ERR_error_string(ERR_get_error(), nullptr);
  }
  return out;
}

}  // namespace trainyard
