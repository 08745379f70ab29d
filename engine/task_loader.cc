#include "engine/task_loader.h"

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <set>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/file_util.h"
#include "core/status_macros.h"

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

// Refuse single allocations and per-call totals beyond these: a plugin asking
// for absurd sizes must get NULL, not take the host down with an OOM abort.
constexpr int64_t kMaxTensorBytes = int64_t{1} << 32;   // 4 GiB
constexpr int64_t kMaxCallBytes = int64_t{1} << 33;     // 8 GiB
constexpr size_t kMaxStateDictBytes = size_t{1} << 30;  // 1 GiB

std::string Prefix(const std::string& plugin, const char* call) {
  return absl::StrCat("plugin \"", plugin, "\": ", call, ": ");
}

bool ValidName(const std::string& name) {
  if (name.empty()) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '_';
    if (!ok) return false;
  }
  return true;
}

bool AbiDType(int32_t dtype, DType* out) {
  switch (dtype) {
    case TRAINYARD_FLOAT32:
      *out = DType::kFloat32;
      return true;
    case TRAINYARD_INT32:
      *out = DType::kInt32;
      return true;
    case TRAINYARD_INT64:
      *out = DType::kInt64;
      return true;
    default:
      return false;
  }
}

// The sink handed to one plugin call. Records the first misuse; the call is
// failed after it returns even if the plugin reports success.
class HostSink {
 public:
  HostSink(bool allow_tensors, bool allow_metrics, bool allow_bytes)
      : allow_tensors_(allow_tensors),
        allow_metrics_(allow_metrics),
        allow_bytes_(allow_bytes) {
    abi_.ctx = this;
    abi_.add_tensor = &HostSink::AddTensorThunk;
    abi_.add_metric = &HostSink::AddMetricThunk;
    abi_.add_bytes = &HostSink::AddBytesThunk;
  }
  HostSink(const HostSink&) = delete;
  HostSink& operator=(const HostSink&) = delete;

  TrainyardSink* abi() { return &abi_; }
  const std::string& violation() const { return violation_; }
  NamedTensors& tensors() { return tensors_; }
  Metrics& metrics() { return metrics_; }
  std::string& bytes() { return bytes_; }

 private:
  static void* AddTensorThunk(void* ctx, const char* name, int32_t dtype,
                              int32_t ndim, const int64_t* shape) {
    return static_cast<HostSink*>(ctx)->AddTensor(name, dtype, ndim, shape);
  }
  static void AddMetricThunk(void* ctx, const char* name, double value) {
    static_cast<HostSink*>(ctx)->AddMetric(name, value);
  }
  static void AddBytesThunk(void* ctx, const void* data, size_t len) {
    static_cast<HostSink*>(ctx)->AddBytes(data, len);
  }

  void Refuse(std::string why) {
    if (violation_.empty()) violation_ = std::move(why);
  }

  void* AddTensor(const char* name, int32_t dtype, int32_t ndim,
                  const int64_t* shape) {
    if (!allow_tensors_) {
      Refuse("sink misuse: add_tensor is not allowed in this call");
      return nullptr;
    }
    if (name == nullptr || name[0] == '\0') {
      Refuse("sink misuse: add_tensor with a NULL or empty name");
      return nullptr;
    }
    const std::string n(name);
    DType dt;
    if (!AbiDType(dtype, &dt)) {
      Refuse(absl::StrCat("sink misuse: add_tensor \"", n,
                          "\": unsupported dtype ", dtype,
                          " (expected 0 float32, 2 int32 or 3 int64)"));
      return nullptr;
    }
    if (ndim < 0 || ndim > TRAINYARD_MAX_DIMS) {
      Refuse(absl::StrCat("sink misuse: add_tensor \"", n, "\": ndim ", ndim,
                          " outside [0, ", TRAINYARD_MAX_DIMS, "]"));
      return nullptr;
    }
    if (ndim > 0 && shape == nullptr) {
      Refuse(absl::StrCat("sink misuse: add_tensor \"", n,
                          "\": NULL shape with ndim ", ndim));
      return nullptr;
    }
    Shape s(shape, shape + ndim);
    int64_t bytes = static_cast<int64_t>(DTypeSize(dt));
    for (int64_t d : s) {
      if (d < 0) {
        Refuse(absl::StrCat("sink misuse: add_tensor \"", n,
                            "\": negative dimension in shape ",
                            ShapeToString(s)));
        return nullptr;
      }
      if (d > 0 && bytes > kMaxTensorBytes / d) {
        bytes = kMaxTensorBytes + 1;
      } else {
        bytes *= d;
      }
    }
    if (bytes > kMaxTensorBytes || call_bytes_ + bytes > kMaxCallBytes) {
      Refuse(absl::StrCat("sink misuse: add_tensor \"", n, "\": shape ",
                          ShapeToString(s), " exceeds the host's limit of ",
                          kMaxTensorBytes, " bytes per tensor / ",
                          kMaxCallBytes, " per call"));
      return nullptr;
    }
    if (!names_.insert(n).second) {
      Refuse(absl::StrCat("sink misuse: duplicate tensor name \"", n, "\""));
      return nullptr;
    }
    call_bytes_ += bytes;
    Tensor t = Tensor::Zeros(dt, s);
    tensors_.emplace_back(n, t);
    if (bytes == 0) {
      // The ABI reserves NULL for refusal; give empty tensors a valid
      // address that must never be written through.
      alignas(64) static char empty[64];
      return empty;
    }
    return t.raw_data();
  }

  void AddMetric(const char* name, double value) {
    if (!allow_metrics_) {
      Refuse("sink misuse: add_metric is not allowed in this call");
      return;
    }
    if (name == nullptr || name[0] == '\0') {
      Refuse("sink misuse: add_metric with a NULL or empty name");
      return;
    }
    const std::string n(name);
    if (!std::isfinite(value)) {
      Refuse(absl::StrCat("metric \"", n, "\" is not finite: ", value));
      return;
    }
    if (!names_.insert(n).second) {
      Refuse(absl::StrCat("sink misuse: duplicate metric name \"", n, "\""));
      return;
    }
    metrics_.emplace_back(n, value);
  }

  void AddBytes(const void* data, size_t len) {
    if (!allow_bytes_) {
      Refuse("sink misuse: add_bytes is not allowed in this call");
      return;
    }
    if (len == 0) return;
    if (data == nullptr) {
      Refuse(absl::StrCat("sink misuse: add_bytes with NULL data and length ",
                          len));
      return;
    }
    if (len > kMaxStateDictBytes - bytes_.size()) {
      Refuse(absl::StrCat("add_bytes: state exceeds the host's limit of ",
                          kMaxStateDictBytes, " bytes"));
      return;
    }
    bytes_.append(static_cast<const char*>(data), len);
  }

  TrainyardSink abi_;
  const bool allow_tensors_;
  const bool allow_metrics_;
  const bool allow_bytes_;
  std::string violation_;
  std::set<std::string> names_;
  int64_t call_bytes_ = 0;
  NamedTensors tensors_;
  Metrics metrics_;
  std::string bytes_;
};

// Runs one plugin call: a clean error buffer, exceptions caught, a non-zero
// return turned into InvalidArgument, a sink violation into Internal.
template <typename F>
absl::Status CallPlugin(const TaskPlugin& plugin, const char* call,
                        const HostSink* sink, F&& f) {
  TrainyardError err;
  std::memset(&err, 0, sizeof(err));
  int rc = 0;
  try {
    rc = f(&err);
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat(Prefix(plugin.name(), call),
                     "threw a C++ exception across the ABI: ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat(
        Prefix(plugin.name(), call), "threw an exception across the ABI"));
  }
  if (rc != 0) {
    err.message[TRAINYARD_ERROR_LEN - 1] = '\0';
    const char* msg =
        err.message[0] != '\0' ? err.message : "failed without a message";
    std::string host_note;
    if (sink != nullptr && !sink->violation().empty()) {
      host_note = absl::StrCat(" (host: ", sink->violation(), ")");
    }
    return absl::InvalidArgumentError(
        absl::StrCat(Prefix(plugin.name(), call), msg, host_note));
  }
  if (sink != nullptr && !sink->violation().empty()) {
    return absl::InternalError(
        absl::StrCat(Prefix(plugin.name(), call), sink->violation()));
  }
  return absl::OkStatus();
}

// Tensors viewed as ABI tensors. Keeps the names alive. Host tensors
// (float32, int32, int64) for the v1 calls; device tensors (those and
// bfloat16) for compute_loss_device.
class AbiTensors {
 public:
  absl::Status Add(const std::string& name, const Tensor& t,
                   const std::string& prefix, bool on_device = false) {
    if (on_device == t.device().is_cpu()) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "tensor \"", name, "\" is on ", t.device().ToString(),
          on_device ? "; compute_loss_device takes device tensors"
                    : "; the plugin ABI takes host tensors"));
    }
    int32_t dtype = -1;
    switch (t.dtype()) {
      case DType::kFloat32:
        dtype = TRAINYARD_FLOAT32;
        break;
      case DType::kBFloat16:
        if (on_device) dtype = TRAINYARD_BFLOAT16;
        break;
      case DType::kInt32:
        dtype = TRAINYARD_INT32;
        break;
      case DType::kInt64:
        dtype = TRAINYARD_INT64;
        break;
      default:
        break;
    }
    if (dtype < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "tensor \"", name, "\" has dtype ",
                       DTypeName(t.dtype()), "; the plugin ABI takes float32, ",
                       on_device ? "bfloat16, " : "", "int32 or int64"));
    }
    if (t.ndim() > TRAINYARD_MAX_DIMS) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "tensor \"", name, "\" has ", t.ndim(),
                       " dims; the plugin ABI allows ", TRAINYARD_MAX_DIMS));
    }
    names_.push_back(std::make_unique<std::string>(name));
    TrainyardTensor a;
    std::memset(&a, 0, sizeof(a));
    a.name = names_.back()->c_str();
    a.dtype = dtype;
    a.ndim = t.ndim();
    for (int i = 0; i < t.ndim(); ++i) a.shape[i] = t.dim(i);
    a.data = const_cast<void*>(t.ptr());
    tensors_.push_back(a);
    return absl::OkStatus();
  }
  const TrainyardTensor* data() const { return tensors_.data(); }
  int32_t size() const { return static_cast<int32_t>(tensors_.size()); }
  TrainyardTensor& at(int i) { return tensors_[i]; }

 private:
  std::vector<std::unique_ptr<std::string>> names_;
  std::vector<TrainyardTensor> tensors_;
};

struct DlCloser {
  void operator()(void* h) const {
    if (h != nullptr) dlclose(h);
  }
};

// Whether the ELF shared object at `path` defines `symbol` in its dynamic
// symbol table, read from the file without loading it (loading runs the
// library's constructors). FailedPrecondition when it is not a 64-bit
// little-endian ELF shared object or its tables are malformed.
absl::StatusOr<bool> ElfExportsSymbol(const std::string& path,
                                      const char* symbol, uint64_t file_size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  auto bad = [&path](const std::string& why) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is not a task plugin: ", why));
  };
  auto read_at = [&](uint64_t offset, uint64_t size, std::string* out) -> bool {
    if (offset > file_size || size > file_size - offset) return false;
    out->resize(size);
    return ::pread(fd, out->data(), size, static_cast<off_t>(offset)) ==
           static_cast<ssize_t>(size);
  };
  std::string bytes;
  if (!read_at(0, sizeof(Elf64_Ehdr), &bytes) ||
      std::memcmp(bytes.data(), ELFMAG, SELFMAG) != 0) {
    return bad("not an ELF file");
  }
  Elf64_Ehdr eh;
  std::memcpy(&eh, bytes.data(), sizeof(eh));
  if (eh.e_ident[EI_CLASS] != ELFCLASS64 ||
      eh.e_ident[EI_DATA] != ELFDATA2LSB || eh.e_type != ET_DYN) {
    return bad("not a 64-bit little-endian ELF shared object");
  }
  if (eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shnum == 0) {
    return bad("no section headers");
  }
  std::string table;
  if (!read_at(eh.e_shoff, uint64_t{eh.e_shnum} * sizeof(Elf64_Shdr), &table)) {
    return bad("section headers past the end of the file");
  }
  std::vector<Elf64_Shdr> sections(eh.e_shnum);
  std::memcpy(sections.data(), table.data(), table.size());
  for (const Elf64_Shdr& sh : sections) {
    if (sh.sh_type != SHT_DYNSYM) continue;
    if (sh.sh_entsize != sizeof(Elf64_Sym) || sh.sh_link >= sections.size()) {
      return bad("malformed dynamic symbol table");
    }
    const Elf64_Shdr& strtab = sections[sh.sh_link];
    std::string syms, names;
    if (!read_at(sh.sh_offset, sh.sh_size, &syms) ||
        !read_at(strtab.sh_offset, strtab.sh_size, &names)) {
      return bad("dynamic symbol table past the end of the file");
    }
    for (size_t off = 0; off + sizeof(Elf64_Sym) <= syms.size();
         off += sizeof(Elf64_Sym)) {
      Elf64_Sym sym;
      std::memcpy(&sym, syms.data() + off, sizeof(sym));
      if (sym.st_shndx == SHN_UNDEF || sym.st_name >= names.size()) continue;
      const char* name = names.data() + sym.st_name;
      const size_t max = names.size() - sym.st_name;
      if (strnlen(name, max) < max && std::strcmp(name, symbol) == 0) {
        return true;
      }
    }
  }
  return false;
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

// Whether `json` is "{}" give or take whitespace: a config that cannot hold
// a file path.
bool IsEmptyJsonObject(const std::string& json) {
  std::string compact;
  for (char c : json) {
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') compact += c;
  }
  return compact == "{}";
}

// The real path (absolute, symlinks resolved) of the existing folder `dir`.
absl::StatusOr<std::string> RealFolder(const std::string& dir) {
  char buf[PATH_MAX];
  if (realpath(dir.c_str(), buf) == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("data folder ", dir, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("data folder ", dir, ": not a directory"));
  }
  return std::string(buf);
}

std::string DlError() {
  const char* e = dlerror();
  return e != nullptr ? std::string(e) : std::string("(no dlerror text)");
}

}  // namespace

absl::StatusOr<std::unique_ptr<TaskPlugin>> TaskPlugin::Load(
    const std::string& plugin_dir, const std::string& name) {
  const std::string who = absl::StrCat("plugin \"", name, "\": ");
  if (!ValidName(name)) {
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
  // Only a library that exports the ABI symbol is loaded: dlopen would run
  // any other library's constructors (the plugin folder also holds our own
  // support libraries).
  {
    absl::StatusOr<bool> exports = ElfExportsSymbol(
        path, TRAINYARD_TASK_SYMBOL_V1, static_cast<uint64_t>(st.st_size));
    if (!exports.ok()) return Prefixed(exports.status(), who);
    if (!*exports) {
      return absl::NotFoundError(absl::StrCat(
          who, "symbol ", TRAINYARD_TASK_SYMBOL_V1, " not found in ", path,
          " (not a Trainyard task plugin; it was not loaded)"));
    }
  }
  dlerror();
  // RTLD_NOW: unresolved symbols fail here, not mid-run. RTLD_NODELETE: the
  // code stays mapped after dlclose, because a plugin may leave threads
  // running in it (e.g. a BLAS thread pool in a teacher model), or TLS
  // destructors and atexit handlers pointing into it; unmapping would crash
  // the host later.
  std::unique_ptr<void, DlCloser> handle(
      dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE));
  if (handle == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, "dlopen failed for ", path, ": ", DlError()));
  }
  dlerror();
  void* sym = dlsym(handle.get(), TRAINYARD_TASK_SYMBOL_V1);
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
  if (table->abi_version != TRAINYARD_TASK_ABI_VERSION) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, path, " speaks task ABI version ", table->abi_version,
                     ", this host speaks ", TRAINYARD_TASK_ABI_VERSION));
  }
  if (table->struct_size != TRAINYARD_TASK_V1_SIZE_CURRENT &&
      table->struct_size != TRAINYARD_TASK_V1_SIZE_BASE) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, path, ": TrainyardTaskV1 struct_size is ", table->struct_size,
        ", expected ", TRAINYARD_TASK_V1_SIZE_CURRENT, " (or ",
        TRAINYARD_TASK_V1_SIZE_BASE, ", the layout before validate_config)"));
  }
  // Only the bytes the plugin declares are read: an older table ends at
  // destroy, and the fields after it stay NULL in the copy.
  TrainyardTaskV1 copy;
  std::memset(&copy, 0, sizeof(copy));
  std::memcpy(&copy, table, table->struct_size);
  if (copy.name == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, path, ": TrainyardTaskV1.name is NULL"));
  }
  const std::pair<const char*, bool> required[] = {
      {"create", copy.create != nullptr},
      {"build_forward_inputs", copy.build_forward_inputs != nullptr},
      {"compute_loss", copy.compute_loss != nullptr},
      {"update_metrics", copy.update_metrics != nullptr},
      {"destroy", copy.destroy != nullptr},
  };
  for (const auto& [field, present] : required) {
    if (!present) {
      return absl::FailedPreconditionError(
          absl::StrCat(who, path, ": required function TrainyardTaskV1.", field,
                       " is NULL"));
    }
  }
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
  const std::pair<const char*, bool> required[] = {
      {"workspace_bytes", t->workspace_bytes != nullptr},
      {"compute_loss_device", t->compute_loss_device != nullptr},
      {"finish_loss", t->finish_loss != nullptr},
  };
  for (const auto& [field, present] : required) {
    if (!present) {
      return absl::FailedPreconditionError(absl::StrCat(
          who, "required function TrainyardTaskV2.", field, " is NULL"));
    }
  }
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
  std::memset(&err, 0, sizeof(err));
  int rc = 0;
  try {
    rc = table_.validate_config(config.c_str(), &err);
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat(Prefix(name_, "validate_config"),
                     "threw a C++ exception across the ABI: ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat(
        Prefix(name_, "validate_config"), "threw an exception across the ABI"));
  }
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

absl::StatusOr<std::unique_ptr<Task>> Task::Create(
    std::shared_ptr<const TaskPlugin> plugin, const std::string& config_json,
    const std::string& data_dir) {
  if (plugin == nullptr) {
    return absl::InvalidArgumentError("Task::Create: null plugin");
  }
  const std::string config = config_json.empty() ? "{}" : config_json;
  const TrainyardTaskV1& t = plugin->table();
  std::string real_data_dir;
  if (!data_dir.empty()) {
    absl::StatusOr<std::string> real = RealFolder(data_dir);
    if (!real.ok()) {
      return Prefixed(real.status(), Prefix(plugin->name(), "create"));
    }
    real_data_dir = *std::move(real);
    if (t.create_confined == nullptr && !IsEmptyJsonObject(config)) {
      return absl::FailedPreconditionError(absl::StrCat(
          Prefix(plugin->name(), "create"), "the plugin cannot confine file ",
          "paths in task.config to the data folder ", real_data_dir,
          " (its table has no create_confined: built before it, or from an ",
          "SDK plugin whose Create takes no CreateContext), so it accepts ",
          "only an empty task.config here"));
    }
  }
  void* handle = nullptr;
  RETURN_IF_ERROR(
      CallPlugin(*plugin, "create", nullptr, [&](TrainyardError* err) {
        handle =
            real_data_dir.empty() || t.create_confined == nullptr
                ? t.create(config.c_str(), err)
                : t.create_confined(config.c_str(), real_data_dir.c_str(), err);
        if (handle == nullptr) {
          if (err->message[0] == '\0') {
            std::snprintf(err->message, sizeof(err->message),
                          "returned NULL without a message");
          }
          return 1;
        }
        return 0;
      }));
  return std::unique_ptr<Task>(new Task(std::move(plugin), handle));
}

Task::~Task() {
  if (handle_ == nullptr) return;
  try {
    plugin_->table().destroy(handle_);
  } catch (...) {
    // destroy must not throw; nothing sensible to do in a destructor.
  }
}

absl::Status Task::CheckUsable(const char* call) const {
  if (finalized_) {
    return absl::FailedPreconditionError(
        absl::StrCat(Prefix(plugin_->name(), call), "called after finalize"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ForwardInputs> Task::BuildForwardInputs(
    const NamedTensors& batch, int64_t step, bool is_eval) {
  constexpr const char* kCall = "build_forward_inputs";
  RETURN_IF_ERROR(CheckUsable(kCall));
  const std::string prefix = Prefix(plugin_->name(), kCall);
  if (batch.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "empty batch"));
  }
  AbiTensors in;
  int64_t b = -1;
  std::set<std::string> seen;
  for (const auto& [name, t] : batch) {
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "duplicate batch tensor \"", name, "\""));
    }
    if (t.ndim() < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "batch tensor \"", name, "\" must have rank >= 1"));
    }
    if (b < 0) b = t.dim(0);
    if (t.dim(0) != b) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "batch tensor \"", name, "\" has ", t.dim(0),
          " rows, expected ", b, " like \"", batch[0].first, "\""));
    }
    RETURN_IF_ERROR(in.Add(name, t, prefix));
  }
  TrainyardBatch abi_batch;
  abi_batch.tensors = in.data();
  abi_batch.num_tensors = in.size();
  abi_batch.step = step;
  abi_batch.is_eval = is_eval ? 1 : 0;
  HostSink sink(/*tensors=*/true, /*metrics=*/false, /*bytes=*/false);
  RETURN_IF_ERROR(CallPlugin(*plugin_, kCall, &sink, [&](TrainyardError* err) {
    return plugin_->table().build_forward_inputs(handle_, &abi_batch,
                                                 sink.abi(), err);
  }));
  ForwardInputs result;
  bool have_inputs = false;
  for (auto& [name, t] : sink.tensors()) {
    if (name == "inputs") {
      if (t.dtype() != DType::kFloat32 || t.ndim() != 2) {
        return absl::InternalError(
            absl::StrCat(prefix, "\"inputs\" must be float32 [B, D], got ",
                         DTypeName(t.dtype()), " ", ShapeToString(t.shape())));
      }
      if (t.dim(0) != b) {
        return absl::InternalError(absl::StrCat(
            prefix, "\"inputs\" has ", t.dim(0), " rows, the batch has ", b));
      }
      result.inputs = t;
      have_inputs = true;
      continue;
    }
    if (t.ndim() < 1 || t.dim(0) != b) {
      return absl::InternalError(absl::StrCat(
          prefix, "state tensor \"", name, "\" has shape ",
          ShapeToString(t.shape()), "; dim 0 must equal the batch size ", b));
    }
    result.state.emplace_back(name, t);
  }
  if (!have_inputs) {
    return absl::InternalError(
        absl::StrCat(prefix, "did not add the required tensor \"inputs\""));
  }
  return result;
}

absl::StatusOr<LossResult> Task::ComputeLoss(
    const Tensor& output, const NamedTensors& state, Tensor* grad_output,
    int64_t step, int32_t microbatch, int32_t num_microbatches, bool is_eval) {
  constexpr const char* kCall = "compute_loss";
  RETURN_IF_ERROR(CheckUsable(kCall));
  const std::string prefix = Prefix(plugin_->name(), kCall);
  if (output.dtype() != DType::kFloat32 || output.ndim() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "output must be float32 [b, out], got ",
        DTypeName(output.dtype()), " ", ShapeToString(output.shape())));
  }
  if (num_microbatches < 1 || microbatch < 0 ||
      microbatch >= num_microbatches) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "microbatch ",
                                                   microbatch, " outside [0, ",
                                                   num_microbatches, ")"));
  }
  const int64_t b = output.dim(0);
  AbiTensors out_abi;
  RETURN_IF_ERROR(out_abi.Add("output", output, prefix));
  AbiTensors state_abi;
  for (const auto& [name, t] : state) {
    if (t.ndim() < 1 || t.dim(0) != b) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "state tensor \"", name, "\" has shape ",
                       ShapeToString(t.shape()),
                       "; dim 0 must equal the microbatch size ", b));
    }
    RETURN_IF_ERROR(state_abi.Add(name, t, prefix));
  }
  const bool want_grad = !is_eval;
  const bool have_grad = grad_output != nullptr && grad_output->defined();
  if (want_grad || have_grad) {
    if (!have_grad || grad_output->dtype() != DType::kFloat32 ||
        grad_output->shape() != output.shape() ||
        !grad_output->device().is_cpu()) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "grad_output must be a host float32 tensor shaped ",
          ShapeToString(output.shape())));
    }
    grad_output->Fill(0.0f);
  }
  AbiTensors grad_abi;
  if (have_grad) {
    RETURN_IF_ERROR(grad_abi.Add("grad_output", *grad_output, prefix));
  } else {
    RETURN_IF_ERROR(grad_abi.Add("grad_output", output, prefix));
    grad_abi.at(0).data = nullptr;
  }
  TrainyardLossArgs args;
  args.output = out_abi.data();
  args.state = state_abi.data();
  args.num_state = state_abi.size();
  args.grad_output = &grad_abi.at(0);
  args.step = step;
  args.microbatch = microbatch;
  args.num_microbatches = num_microbatches;
  args.is_eval = is_eval ? 1 : 0;
  TrainyardLossResult res;
  res.loss = std::nan("");
  res.loss_weight = std::nan("");
  HostSink sink(/*tensors=*/false, /*metrics=*/true, /*bytes=*/false);
  RETURN_IF_ERROR(CallPlugin(*plugin_, kCall, &sink, [&](TrainyardError* err) {
    return plugin_->table().compute_loss(handle_, &args, &res, sink.abi(), err);
  }));
  const std::string where =
      absl::StrCat(prefix, "step ", step, " microbatch ", microbatch, ": ");
  if (!std::isfinite(res.loss)) {
    return absl::InternalError(
        absl::StrCat(where, "loss is not finite: ", res.loss));
  }
  if (!std::isfinite(res.loss_weight) || res.loss_weight < 0) {
    return absl::InternalError(absl::StrCat(
        where, "loss_weight must be finite and >= 0, got ", res.loss_weight));
  }
  if (res.loss_weight == 0 && res.loss != 0) {
    return absl::InternalError(
        absl::StrCat(where, "loss_weight is 0 but loss is ", res.loss,
                     " (a microbatch that contributes nothing has loss 0)"));
  }
  if (want_grad) {
    const float* g = grad_output->data<float>();
    const int64_t n = grad_output->numel();
    const int64_t cols = output.dim(1);
    for (int64_t i = 0; i < n; ++i) {
      if (!std::isfinite(g[i])) {
        return absl::InternalError(absl::StrCat(where, "grad_output[", i / cols,
                                                ", ", i % cols,
                                                "] is not finite: ", g[i]));
      }
      if (res.loss_weight == 0 && g[i] != 0) {
        return absl::InternalError(
            absl::StrCat(where, "loss_weight is 0 but grad_output[", i / cols,
                         ", ", i % cols, "] is ", g[i]));
      }
    }
  }
  LossResult result;
  result.loss = res.loss;
  result.weight = res.loss_weight;
  result.weighted_loss = res.loss_weight * res.loss;
  result.metrics = std::move(sink.metrics());
  return result;
}

size_t Task::DeviceLossWorkspaceBytes(int64_t rows, int64_t cols) {
  if (!plugin_->has_device_loss()) return 0;
  try {
    return plugin_->device_table().workspace_bytes(handle_, rows, cols);
  } catch (...) {
    return 0;  // compute_loss_device will then refuse the missing workspace
  }
}

absl::Status Task::ComputeLossDevice(Device device, void* stream,
                                     const Tensor& output,
                                     const NamedTensors& state,
                                     Tensor* grad_output, double* slots,
                                     const Tensor& workspace, int64_t step,
                                     int32_t microbatch,
                                     int32_t num_microbatches, bool is_eval) {
  constexpr const char* kCall = "compute_loss_device";
  RETURN_IF_ERROR(CheckUsable(kCall));
  const std::string prefix = Prefix(plugin_->name(), kCall);
  if (!plugin_->has_device_loss()) {
    return absl::FailedPreconditionError(
        absl::StrCat(prefix, "the plugin has no device loss (no ",
                     TRAINYARD_TASK_SYMBOL_V2, ")"));
  }
  if (device.is_cpu()) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "needs a device (CUDA or simulated), got cpu"));
  }
  if ((output.dtype() != DType::kFloat32 &&
       output.dtype() != DType::kBFloat16) ||
      output.ndim() != 2 || output.device() != device) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "output must be float32 or bfloat16 [b, out] on ",
        device.ToString(), ", got ", DTypeName(output.dtype()), " ",
        ShapeToString(output.shape()), " on ", output.device().ToString()));
  }
  if (num_microbatches < 1 || microbatch < 0 ||
      microbatch >= num_microbatches) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "microbatch ",
                                                   microbatch, " outside [0, ",
                                                   num_microbatches, ")"));
  }
  if (slots == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "no slots"));
  }
  const size_t need = DeviceLossWorkspaceBytes(output.dim(0), output.dim(1));
  if (need > 0 && (!workspace.defined() || workspace.nbytes() < need ||
                   workspace.device() != device)) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "needs ", need, " bytes of workspace on ",
                     device.ToString(), ", got ", workspace.nbytes()));
  }
  const int64_t b = output.dim(0);
  AbiTensors out_abi;
  RETURN_IF_ERROR(out_abi.Add("output", output, prefix, /*on_device=*/true));
  AbiTensors state_abi;
  for (const auto& [name, t] : state) {
    if (t.ndim() < 1 || t.dim(0) != b || t.device() != device) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "state tensor \"", name, "\" is ", ShapeToString(t.shape()),
          " on ", t.device().ToString(), "; dim 0 must equal the microbatch ",
          "size ", b, " on ", device.ToString()));
    }
    RETURN_IF_ERROR(state_abi.Add(name, t, prefix, /*on_device=*/true));
  }
  AbiTensors grad_abi;
  if (!is_eval) {
    if (grad_output == nullptr || grad_output->dtype() != output.dtype() ||
        grad_output->shape() != output.shape() ||
        grad_output->device() != device) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "grad_output must be ", DTypeName(output.dtype()),
          ShapeToString(output.shape()), " on ", device.ToString()));
    }
    RETURN_IF_ERROR(
        grad_abi.Add("grad_output", *grad_output, prefix, /*on_device=*/true));
  } else {
    RETURN_IF_ERROR(
        grad_abi.Add("grad_output", output, prefix, /*on_device=*/true));
    grad_abi.at(0).data = nullptr;
  }
  TrainyardDeviceLossArgs args;
  std::memset(&args, 0, sizeof(args));
  args.device_kind =
      device.is_cuda() ? TRAINYARD_DEVICE_CUDA : TRAINYARD_DEVICE_SIM;
  args.device_index = device.index;
  args.stream = stream;
  args.output = out_abi.data();
  args.state = state_abi.data();
  args.num_state = state_abi.size();
  args.grad_output = &grad_abi.at(0);
  args.slots = slots;
  args.workspace = need > 0 ? const_cast<void*>(workspace.ptr()) : nullptr;
  args.workspace_bytes = need;
  args.step = step;
  args.microbatch = microbatch;
  args.num_microbatches = num_microbatches;
  args.is_eval = is_eval ? 1 : 0;
  return CallPlugin(*plugin_, kCall, nullptr, [&](TrainyardError* err) {
    return plugin_->device_table().compute_loss_device(handle_, &args, err);
  });
}

absl::StatusOr<LossResult> Task::FinishLoss(const double* slots, int64_t step,
                                            int32_t microbatch,
                                            int32_t num_microbatches,
                                            bool is_eval) {
  constexpr const char* kCall = "finish_loss";
  RETURN_IF_ERROR(CheckUsable(kCall));
  if (!plugin_->has_device_loss()) {
    return absl::FailedPreconditionError(absl::StrCat(
        Prefix(plugin_->name(), kCall), "the plugin has no device loss (no ",
        TRAINYARD_TASK_SYMBOL_V2, ")"));
  }
  HostSink sink(/*tensors=*/false, /*metrics=*/true, /*bytes=*/false);
  RETURN_IF_ERROR(CallPlugin(*plugin_, kCall, &sink, [&](TrainyardError* err) {
    return plugin_->device_table().finish_loss(
        handle_, slots, step, microbatch, num_microbatches, is_eval ? 1 : 0,
        sink.abi(), err);
  }));
  // The checks ComputeLoss makes of a host result, on the slots.
  const std::string where =
      absl::StrCat(Prefix(plugin_->name(), "compute_loss_device"), "step ",
                   step, " microbatch ", microbatch, ": ");
  const double w = slots[TRAINYARD_SLOT_WEIGHT];
  const double wl = slots[TRAINYARD_SLOT_WEIGHTED_LOSS];
  if (!std::isfinite(w) || w < 0) {
    return absl::InternalError(
        absl::StrCat(where, "loss_weight must be finite and >= 0, got ", w));
  }
  const double loss = w > 0 ? wl / w : wl;
  if (!std::isfinite(loss)) {
    return absl::InternalError(
        absl::StrCat(where, "loss is not finite: ", loss));
  }
  if (w == 0 && wl != 0) {
    return absl::InternalError(
        absl::StrCat(where, "loss_weight is 0 but loss is ", wl,
                     " (a microbatch that contributes nothing has loss 0)"));
  }
  LossResult result;
  result.loss = loss;
  result.weight = w;
  result.weighted_loss = wl;
  result.metrics = std::move(sink.metrics());
  return result;
}

absl::StatusOr<Metrics> Task::UpdateMetrics(bool is_eval) {
  constexpr const char* kCall = "update_metrics";
  RETURN_IF_ERROR(CheckUsable(kCall));
  HostSink sink(/*tensors=*/false, /*metrics=*/true, /*bytes=*/false);
  RETURN_IF_ERROR(CallPlugin(*plugin_, kCall, &sink, [&](TrainyardError* err) {
    return plugin_->table().update_metrics(handle_, is_eval ? 1 : 0, sink.abi(),
                                           err);
  }));
  return std::move(sink.metrics());
}

absl::StatusOr<std::string> Task::StateDict() {
  constexpr const char* kCall = "state_dict";
  RETURN_IF_ERROR(CheckUsable(kCall));
  if (plugin_->table().state_dict == nullptr) return std::string();
  HostSink sink(/*tensors=*/false, /*metrics=*/false, /*bytes=*/true);
  RETURN_IF_ERROR(CallPlugin(*plugin_, kCall, &sink, [&](TrainyardError* err) {
    return plugin_->table().state_dict(handle_, sink.abi(), err);
  }));
  return std::move(sink.bytes());
}

absl::Status Task::LoadStateDict(const std::string& bytes) {
  constexpr const char* kCall = "load_state_dict";
  RETURN_IF_ERROR(CheckUsable(kCall));
  if (plugin_->table().load_state_dict == nullptr) {
    if (bytes.empty()) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        Prefix(plugin_->name(), kCall), "the plugin is stateless but got ",
        bytes.size(), " bytes of state"));
  }
  return CallPlugin(*plugin_, kCall, nullptr, [&](TrainyardError* err) {
    return plugin_->table().load_state_dict(handle_, bytes.data(), bytes.size(),
                                            err);
  });
}

absl::Status Task::OnEvent(TrainyardEventKind kind, int64_t step,
                           const std::string& detail) {
  constexpr const char* kCall = "on_event";
  RETURN_IF_ERROR(CheckUsable(kCall));
  if (kind < TRAINYARD_EVENT_STEP_BEGIN || kind > TRAINYARD_EVENT_JOB_END) {
    return absl::InvalidArgumentError(absl::StrCat(
        Prefix(plugin_->name(), kCall), "unknown event kind ", kind));
  }
  if (plugin_->table().on_event == nullptr) return absl::OkStatus();
  TrainyardEvent event;
  event.kind = kind;
  event.step = step;
  event.detail = detail.c_str();
  return CallPlugin(*plugin_, kCall, nullptr, [&](TrainyardError* err) {
    return plugin_->table().on_event(handle_, &event, err);
  });
}

absl::Status Task::Finalize() {
  constexpr const char* kCall = "finalize";
  RETURN_IF_ERROR(CheckUsable(kCall));
  finalized_ = true;
  if (plugin_->table().finalize == nullptr) return absl::OkStatus();
  return CallPlugin(*plugin_, kCall, nullptr, [&](TrainyardError* err) {
    return plugin_->table().finalize(handle_, err);
  });
}

}  // namespace trainyard
