#include "engine/plugin_call.h"

#include <cstring>
#include <exception>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace trainyard {

std::string PluginCallPrefix(const std::string& plugin, const char* call) {
  return absl::StrCat("plugin \"", plugin, "\": ", call, ": ");
}

absl::StatusOr<int> CallCatchingExceptions(
    const std::string& plugin, const char* call,
    absl::FunctionRef<int(TrainyardError*)> f, TrainyardError* err) {
  std::memset(err, 0, sizeof(*err));
  try {
    return f(err);
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat(PluginCallPrefix(plugin, call),
                     "threw a C++ exception across the ABI: ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat(
        PluginCallPrefix(plugin, call), "threw an exception across the ABI"));
  }
}

absl::Status CallPlugin(const std::string& plugin, const char* call,
                        const HostSink* sink,
                        absl::FunctionRef<int(TrainyardError*)> f) {
  TrainyardError err;
  ASSIGN_OR_RETURN(const int rc, CallCatchingExceptions(plugin, call, f, &err));
  if (rc != 0) {
    err.message[TRAINYARD_ERROR_LEN - 1] = '\0';
    const char* msg =
        err.message[0] != '\0' ? err.message : "failed without a message";
    std::string host_note;
    if (sink != nullptr && !sink->violation().empty()) {
      host_note = absl::StrCat(" (host: ", sink->violation(), ")");
    }
    return absl::InvalidArgumentError(
        absl::StrCat(PluginCallPrefix(plugin, call), msg, host_note));
  }
  if (sink != nullptr && !sink->violation().empty()) {
    return absl::InternalError(
        absl::StrCat(PluginCallPrefix(plugin, call), sink->violation()));
  }
  return absl::OkStatus();
}

}  // namespace trainyard
