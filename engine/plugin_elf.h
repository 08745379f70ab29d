// Reads an ELF shared object's dynamic symbol table from its file, without
// loading it: the plugin host loads only libraries that export the task
// ABI's entry point (loading runs a library's constructors).
#ifndef TRAINYARD_ENGINE_PLUGIN_ELF_H_
#define TRAINYARD_ENGINE_PLUGIN_ELF_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace trainyard {

// Whether the ELF shared object at `path`, `file_size` bytes long, defines
// `symbol` in its dynamic symbol table. FailedPrecondition when the file
// cannot be opened, or is not a 64-bit little-endian ELF shared object, or
// its tables are malformed ("<path> is not a task plugin: <why>").
absl::StatusOr<bool> ElfExportsSymbol(const std::string& path,
                                      const char* symbol, uint64_t file_size);

}  // namespace trainyard

#endif  // TRAINYARD_ENGINE_PLUGIN_ELF_H_
