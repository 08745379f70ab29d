#include "worker/worker_options.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/device.h"
#include "core/host_info.h"
#include "grpcpp/grpcpp.h"

namespace trainyard {
namespace {

bool IsDirectory(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

absl::StatusOr<WorkerOptions> ValidateWorkerOptions(WorkerOptions options) {
  if (options.controller.empty()) {
    return absl::InvalidArgumentError(
        "--controller: required (host:port of the controller)");
  }
  if (options.device.empty()) options.device = "cpu";
  {
    absl::StatusOr<Device> device = ParseDevice(options.device);
    if (!device.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--device: ", device.status().message()));
    }
    options.device = device->ToString();  // canonical: "cpu" or "cuda:N"
  }
  if (options.plugin_dir.empty()) {
    return absl::InvalidArgumentError("--plugin_dir: required");
  }
  if (!IsDirectory(options.plugin_dir)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--plugin_dir ", options.plugin_dir, ": not a directory"));
  }
  if (!options.data_dir.empty() && !IsDirectory(options.data_dir)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--data_dir ", options.data_dir, ": not a directory"));
  }
  if (options.threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--threads: must be >= 0, got ", options.threads));
  }
  {
    grpc::ChannelArguments unused;
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
        MakeChannelCredentials(options.tls, &unused);
    if (!creds.ok()) return creds.status();
  }
  if (options.connect_transport && options.peer_address.empty()) {
    return absl::InvalidArgumentError(
        "WorkerOptions.peer_address: required with connect_transport");
  }
  if (options.name.empty()) {
    options.name = absl::StrCat(Hostname(), "-", getpid());
  }
  if (options.memory_bytes == 0) options.memory_bytes = PhysicalMemoryBytes();
  if (options.min_backoff <= absl::ZeroDuration()) {
    options.min_backoff = absl::Milliseconds(10);
  }
  options.max_backoff = std::max(options.max_backoff, options.min_backoff);
  return options;
}

}  // namespace trainyard
