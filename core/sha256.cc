#include "core/sha256.h"

#include <openssl/evp.h>

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

}  // namespace trainyard
