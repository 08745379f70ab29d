#include "cli/connect.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "cli/cli_flags.h"
#include "cli/job_client.h"
#include "core/file_util.h"
#include "core/status_macros.h"

namespace trainyard {
namespace {

std::string GetEnv(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

}  // namespace

std::string ControllerAddress(const CliFlags& flags) {
  std::string a = flags.controller;
  if (!a.empty()) return a;
  const char* env = std::getenv("TRAINYARD_CONTROLLER");
  return env != nullptr && *env != '\0' ? env : "127.0.0.1:7070";
}

absl::StatusOr<std::string> TokenFromFlags(const CliFlags& flags) {
  std::string file = flags.token_file;
  std::string what = "--token_file";
  if (file.empty()) {
    const std::string token = GetEnv("TRAINYARD_TOKEN");
    if (!token.empty()) {
      return std::string(absl::StripAsciiWhitespace(token));
    }
    file = GetEnv("TRAINYARD_TOKEN_FILE");
    what = "$TRAINYARD_TOKEN_FILE";
  }
  if (file.empty()) return std::string();
  absl::StatusOr<int64_t> size = FileSize(file);
  if (size.ok() && *size > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", file, ": ", *size, " bytes; not a token"));
  }
  absl::StatusOr<std::string> text = ReadFileToString(file);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", file, ": ", text.status().message()));
  }
  return std::string(absl::StripAsciiWhitespace(*text));
}

absl::StatusOr<JobClientSecurity> SecurityFromFlags(const CliFlags& flags) {
  JobClientSecurity security;
  security.tls.insecure = flags.insecure;
  if (!security.tls.insecure) {
    security.tls.ca_file = flags.tls_ca;
    if (security.tls.ca_file.empty()) {
      security.tls.ca_file = GetEnv("TRAINYARD_CA");
    }
    security.tls.server_name = flags.tls_server_name;
  }
  // Over plaintext no token is sent (JobClient drops it), so none is read.
  if (!security.tls.insecure) {
    ASSIGN_OR_RETURN(security.token, TokenFromFlags(flags));
  }
  return security;
}

absl::Duration ReconnectWindow(const CliFlags& flags) {
  return absl::Seconds(std::max(1, flags.reconnect_s));
}

std::unique_ptr<JobClient> Connect(const char* command, const CliFlags& flags) {
  absl::StatusOr<JobClientSecurity> security = SecurityFromFlags(flags);
  absl::StatusOr<std::unique_ptr<JobClient>> client =
      security.ok()
          ? JobClient::Create(ControllerAddress(flags), *security)
          : absl::StatusOr<std::unique_ptr<JobClient>>(security.status());
  if (!client.ok()) {
    std::cerr << "trainyard " << command << ": " << client.status().message()
              << "\n";
    return nullptr;
  }
  return *std::move(client);
}

int ReportRpcError(const char* command, const JobClient& client,
                   const absl::Status& st) {
  std::cerr << "trainyard " << command << ": " << client.address() << ": "
            << absl::StatusCodeToString(st.code()) << ": " << st.message()
            << "\n";
  if (absl::IsUnavailable(st)) {
    std::cerr << "trainyard " << command << ": no controller answers at "
              << client.address()
              << "; start trainyard-controller there, or point --controller "
                 "(or $TRAINYARD_CONTROLLER) at one\n";
    std::cerr << "trainyard " << command << ": "
              << (client.tls()
                      ? "this client speaks TLS: if the controller does too, "
                        "pass its CA with --tls_ca (or $TRAINYARD_CA); if it "
                        "runs with --insecure, pass --insecure"
                      : "this client speaks plaintext (--insecure): a "
                        "controller with TLS refuses it; pass its CA with "
                        "--tls_ca (or $TRAINYARD_CA) instead")
              << "\n";
  }
  if (absl::IsInvalidArgument(st) || absl::IsNotFound(st) ||
      absl::IsFailedPrecondition(st)) {
    return 2;
  }
  if (absl::IsUnauthenticated(st) || absl::IsPermissionDenied(st)) return 4;
  return 3;
}

}  // namespace trainyard
