// Calling into a task plugin across the C ABI (task_plugins/task_abi.h): a
// clean error buffer, C++ exceptions stopped at the boundary, and the
// call's outcome as a Status whose message names the plugin and the call.
#ifndef TRAINYARD_ENGINE_PLUGIN_CALL_H_
#define TRAINYARD_ENGINE_PLUGIN_CALL_H_

#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/plugin_tensors.h"
#include "task_plugins/task_abi.h"

namespace trainyard {

// `plugin "<plugin>": <call>: `, the start of every message about a call.
std::string PluginCallPrefix(const std::string& plugin, const char* call);

// Runs `f`, a call of plugin `plugin`'s function `call`, with *err zeroed,
// and returns what it returned. Internal when it threw.
absl::StatusOr<int> CallCatchingExceptions(
    const std::string& plugin, const char* call,
    absl::FunctionRef<int(TrainyardError*)> f, TrainyardError* err);

// Runs one plugin call as CallCatchingExceptions does. A non-zero return is
// InvalidArgument with the plugin's message (and the misuse of `sink`, if
// any, noted); a misuse of `sink` (may be null) with a zero return is
// Internal.
absl::Status CallPlugin(const std::string& plugin, const char* call,
                        const HostSink* sink,
                        absl::FunctionRef<int(TrainyardError*)> f);

}  // namespace trainyard

#endif  // TRAINYARD_ENGINE_PLUGIN_CALL_H_
