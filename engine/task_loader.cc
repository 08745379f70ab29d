// The plugin host's loader: TaskPlugin opens a plugin library, checks that
// it exports the task ABI before loading it, and validates and copies its
// tables (engine/task_loader.h). Task's calls are in engine/task.cc.
#include "engine/task_loader.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <initializer_list>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/file_util.h"
#include "core/status_macros.h"
#include "engine/plugin_call.h"
#include "engine/plugin_checks.h"
#include "engine/plugin_elf.h"

namespace trainyard {

std::string DefaultPluginDir() {
  std::string dir = ExecutableDir();
  for (int up = 0; up < 3; ++up) {
    for (const char* name : {"task_plugins", "plugins"}) {
      const std::string candidate = JoinPath(dir, name);
      struct stat st;
      if (::stat(JoinPath(candidate, "libmse.so").c_str(), &st) == 0) {
        return candidate;
      }
    }
    dir = Dirname(dir);
  }
  return JoinPath(Dirname(ExecutableDir()), "task_plugins");
}

namespace {

struct DlCloser {
  void operator()(void* h) const {
    if (h != nullptr) dlclose(h);
  }
};
using LibraryHandle = std::unique_ptr<void, DlCloser>;

std::string DlError() {
  const char* e = dlerror();
  return e != nullptr ? std::string(e) : std::string("(no dlerror text)");
}

// A message about the task config as the controller reports it: field
// paths under "task.config" as they are, anything else after
// "task.config: "; at most TRAINYARD_ERROR_LEN bytes, cut at a UTF-8
// character boundary.
std::string TaskConfigMessage(const std::string& plugin_message) {
  std::string m = absl::StartsWith(plugin_message, "task.config")
                      ? plugin_message
                      : absl::StrCat("task.config: ", plugin_message);
  if (m.size() > TRAINYARD_ERROR_LEN) {
    size_t n = TRAINYARD_ERROR_LEN;
    while (n > 0 && (static_cast<unsigned char>(m[n]) & 0xC0) == 0x80) --n;
    m.resize(n);
  }
  return m;
}

// FailedPrecondition naming the first of a table's required functions that
// is NULL: "<where>required function <table>.<field> is NULL".
absl::Status CheckRequired(
    const std::string& where, const char* table,
    std::initializer_list<std::pair<const char*, bool>> fields) {
  for (const auto& [field, present] : fields) {
    if (!present) {
      return absl::FailedPreconditionError(absl::StrCat(
          where, "required function ", table, ".", field, " is NULL"));
    }
  }
  return absl::OkStatus();
}

// The library of plugin `name` in `plugin_dir`: a valid name, and a regular
// file that exports the v1 entry point. Only such a library is loaded:
// dlopen would run any other library's constructors (the plugin folder also
// holds our own support libraries). `who` starts every error.
absl::StatusOr<std::string> PluginLibrary(const std::string& who,
                                          const std::string& plugin_dir,
                                          const std::string& name) {
  if (!IsPlainName(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, "invalid plugin name: must match [A-Za-z0-9_]+"));
  }
  if (plugin_dir.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, "empty plugin directory"));
  }
  const std::string path = absl::StrCat(plugin_dir, "/lib", name, ".so");
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(
        absl::StrCat(who, path, ": ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, path, " is not a regular file"));
  }
  absl::StatusOr<bool> exports = ElfExportsSymbol(
      path, TRAINYARD_TASK_SYMBOL_V1, static_cast<uint64_t>(st.st_size));
  if (!exports.ok()) return Prefixed(exports.status(), who);
  if (!*exports) {
    return absl::NotFoundError(absl::StrCat(
        who, "symbol ", TRAINYARD_TASK_SYMBOL_V1, " not found in ", path,
        " (not a Trainyard task plugin; it was not loaded)"));
  }
  return path;
}

// Opens the library at `path` into *handle and returns the table its v1
// entry point returns.
absl::StatusOr<const TrainyardTaskV1*> OpenLibrary(const std::string& who,
                                                   const std::string& path,
                                                   LibraryHandle* handle) {
  dlerror();
  // RTLD_NOW: unresolved symbols fail here, not mid-run. RTLD_NODELETE: the
  // code stays mapped after dlclose, because a plugin may leave threads
  // running in it (e.g. a BLAS thread pool in a teacher model), or TLS
  // destructors and atexit handlers pointing into it; unmapping would crash
  // the host later.
  handle->reset(dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE));
  if (*handle == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, "dlopen failed for ", path, ": ", DlError()));
  }
  dlerror();
  void* sym = dlsym(handle->get(), TRAINYARD_TASK_SYMBOL_V1);
  if (sym == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(who, "symbol ", TRAINYARD_TASK_SYMBOL_V1, " not found in ",
                     path, " (", DlError(), ")"));
  }
  const TrainyardTaskV1* table = nullptr;
  try {
    table = reinterpret_cast<TrainyardTaskV1Entry>(sym)();
  } catch (...) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, TRAINYARD_TASK_SYMBOL_V1, "() in ", path, " threw an exception"));
  }
  if (table == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, TRAINYARD_TASK_SYMBOL_V1, "() in ", path, " returned NULL"));
  }
  return table;
}

// The checked v1 table, in the current layout.
absl::StatusOr<TrainyardTaskV1> CopyTable(const std::string& who,
                                          const std::string& path,
                                          const TrainyardTaskV1& table) {
  if (table.abi_version != TRAINYARD_TASK_ABI_VERSION) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, path, " speaks task ABI version ", table.abi_version,
                     ", this host speaks ", TRAINYARD_TASK_ABI_VERSION));
  }
  if (table.struct_size != TRAINYARD_TASK_V1_SIZE_CURRENT &&
      table.struct_size != TRAINYARD_TASK_V1_SIZE_CONFINED &&
      table.struct_size != TRAINYARD_TASK_V1_SIZE_BASE) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, path, ": TrainyardTaskV1 struct_size is ", table.struct_size,
        ", expected ", TRAINYARD_TASK_V1_SIZE_CURRENT, " (or ",
        TRAINYARD_TASK_V1_SIZE_CONFINED,
        ", the layout before infer_outputs, or ", TRAINYARD_TASK_V1_SIZE_BASE,
        ", the layout before validate_config)"));
  }
  // Only the bytes the plugin declares are read: an older table ends at
  // destroy or create_confined, and the fields after it stay NULL in the
  // copy.
  TrainyardTaskV1 copy;
  std::memset(&copy, 0, sizeof(copy));
  std::memcpy(&copy, &table, table.struct_size);
  if (copy.name == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, path, ": TrainyardTaskV1.name is NULL"));
  }
  RETURN_IF_ERROR(CheckRequired(
      absl::StrCat(who, path, ": "), "TrainyardTaskV1",
      {
          {"create", copy.create != nullptr},
          {"build_forward_inputs", copy.build_forward_inputs != nullptr},
          {"compute_loss", copy.compute_loss != nullptr},
          {"update_metrics", copy.update_metrics != nullptr},
          {"destroy", copy.destroy != nullptr},
      }));
  return copy;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TaskPlugin>> TaskPlugin::Load(
    const std::string& plugin_dir, const std::string& name) {
  const std::string who = absl::StrCat("plugin \"", name, "\": ");
  ASSIGN_OR_RETURN(const std::string path,
                   PluginLibrary(who, plugin_dir, name));
  LibraryHandle handle;
  ASSIGN_OR_RETURN(const TrainyardTaskV1* table,
                   OpenLibrary(who, path, &handle));
  ASSIGN_OR_RETURN(const TrainyardTaskV1 copy, CopyTable(who, path, *table));
  std::unique_ptr<TaskPlugin> plugin(new TaskPlugin(name, path, nullptr, copy));
  // The device half is optional: a plugin without it runs its loss on the
  // host on every device.
  dlerror();
  if (void* sym2 = dlsym(handle.get(), TRAINYARD_TASK_SYMBOL_V2)) {
    RETURN_IF_ERROR(plugin->LoadDeviceTable(sym2, table));
  }
  plugin->handle_ = handle.release();
  return plugin;
}

absl::Status TaskPlugin::LoadDeviceTable(void* entry,
                                         const TrainyardTaskV1* v1) {
  const std::string who = absl::StrCat("plugin \"", name_, "\": ", path_, ": ");
  const TrainyardTaskV2* t = nullptr;
  try {
    t = reinterpret_cast<TrainyardTaskV2Entry>(entry)();
  } catch (...) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, TRAINYARD_TASK_SYMBOL_V2, "() threw an exception"));
  }
  if (t == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, TRAINYARD_TASK_SYMBOL_V2, "() returned NULL"));
  }
  if (t->abi_version != TRAINYARD_TASK_ABI_VERSION_2 ||
      t->struct_size != sizeof(TrainyardTaskV2)) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, "TrainyardTaskV2 has abi_version ", t->abi_version,
        " and struct_size ", t->struct_size, ", this host speaks version ",
        TRAINYARD_TASK_ABI_VERSION_2, " with struct_size ",
        sizeof(TrainyardTaskV2)));
  }
  if (t->v1 != v1) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, "TrainyardTaskV2.v1 is not the table ",
                     TRAINYARD_TASK_SYMBOL_V1, "() returns"));
  }
  if (t->num_slots < TRAINYARD_SLOT_FIRST_METRIC ||
      t->num_slots > TRAINYARD_MAX_SLOTS) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, "TrainyardTaskV2.num_slots is ", t->num_slots, ", expected ",
        TRAINYARD_SLOT_FIRST_METRIC, " to ", TRAINYARD_MAX_SLOTS));
  }
  if ((t->flags & ~TRAINYARD_V2_PASSTHROUGH_INPUTS) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, "TrainyardTaskV2.flags has unknown bits 0x",
                     absl::Hex(t->flags & ~TRAINYARD_V2_PASSTHROUGH_INPUTS)));
  }
  RETURN_IF_ERROR(CheckRequired(
      who, "TrainyardTaskV2",
      {
          {"workspace_bytes", t->workspace_bytes != nullptr},
          {"compute_loss_device", t->compute_loss_device != nullptr},
          {"finish_loss", t->finish_loss != nullptr},
      }));
  v2_ = *t;
  has_v2_ = true;
  return absl::OkStatus();
}

TaskPlugin::~TaskPlugin() {
  if (handle_ != nullptr) dlclose(handle_);
}

absl::StatusOr<ConfigCheck> TaskPlugin::ValidateConfig(
    const std::string& config_json) const {
  if (table_.validate_config == nullptr) return ConfigCheck::kNotChecked;
  const std::string config = config_json.empty() ? "{}" : config_json;
  TrainyardError err;
  ASSIGN_OR_RETURN(const int rc, CallCatchingExceptions(
                                     name_, "validate_config",
                                     [&](TrainyardError* e) {
                                       return table_.validate_config(
                                           config.c_str(), e);
                                     },
                                     &err));
  if (rc == 0) return ConfigCheck::kValid;
  err.message[TRAINYARD_ERROR_LEN - 1] = '\0';
  return absl::InvalidArgumentError(TaskConfigMessage(
      err.message[0] != '\0' ? std::string(err.message)
                             : absl::StrCat("refused by plugin \"", name_,
                                            "\" without a message")));
}

absl::StatusOr<ConfigCheck> ValidateTaskConfig(const std::string& plugin_dir,
                                               const std::string& plugin_name,
                                               const std::string& config_json) {
  ASSIGN_OR_RETURN(std::unique_ptr<TaskPlugin> plugin,
                   TaskPlugin::Load(plugin_dir, plugin_name));
  return plugin->ValidateConfig(config_json);
}

}  // namespace trainyard
