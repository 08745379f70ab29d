#include "engine/plugin_elf.h"

#include <elf.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace trainyard {
namespace {

// An open file read at offsets within its size; closed on destruction.
class BoundedFile {
 public:
  BoundedFile(int fd, uint64_t size) : fd_(fd), size_(size) {}
  ~BoundedFile() { ::close(fd_); }
  BoundedFile(const BoundedFile&) = delete;
  BoundedFile& operator=(const BoundedFile&) = delete;

  // Bytes [offset, offset + size) into *out; false when they are not all
  // in the file.
  bool ReadAt(uint64_t offset, uint64_t size, std::string* out) const {
    if (offset > size_ || size > size_ - offset) return false;
    out->resize(size);
    return ::pread(fd_, out->data(), size, static_cast<off_t>(offset)) ==
           static_cast<ssize_t>(size);
  }

 private:
  const int fd_;
  const uint64_t size_;
};

absl::Status NotAPlugin(const std::string& path, const std::string& why) {
  return absl::FailedPreconditionError(
      absl::StrCat(path, " is not a task plugin: ", why));
}

// The section headers of the 64-bit little-endian ELF shared object in
// `file`.
absl::StatusOr<std::vector<Elf64_Shdr>> ReadSectionHeaders(
    const BoundedFile& file, const std::string& path) {
  std::string bytes;
  if (!file.ReadAt(0, sizeof(Elf64_Ehdr), &bytes) ||
      std::memcmp(bytes.data(), ELFMAG, SELFMAG) != 0) {
    return NotAPlugin(path, "not an ELF file");
  }
  Elf64_Ehdr eh;
  std::memcpy(&eh, bytes.data(), sizeof(eh));
  if (eh.e_ident[EI_CLASS] != ELFCLASS64 ||
      eh.e_ident[EI_DATA] != ELFDATA2LSB || eh.e_type != ET_DYN) {
    return NotAPlugin(path, "not a 64-bit little-endian ELF shared object");
  }
  if (eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shnum == 0) {
    return NotAPlugin(path, "no section headers");
  }
  std::string table;
  if (!file.ReadAt(eh.e_shoff, uint64_t{eh.e_shnum} * sizeof(Elf64_Shdr),
                   &table)) {
    return NotAPlugin(path, "section headers past the end of the file");
  }
  std::vector<Elf64_Shdr> sections(eh.e_shnum);
  std::memcpy(sections.data(), table.data(), table.size());
  return sections;
}

// Whether the dynamic symbol table `dynsym` (one of `sections`) defines
// `symbol`.
absl::StatusOr<bool> DynsymDefines(const BoundedFile& file,
                                   const std::string& path,
                                   const std::vector<Elf64_Shdr>& sections,
                                   const Elf64_Shdr& dynsym,
                                   const char* symbol) {
  if (dynsym.sh_entsize != sizeof(Elf64_Sym) ||
      dynsym.sh_link >= sections.size()) {
    return NotAPlugin(path, "malformed dynamic symbol table");
  }
  const Elf64_Shdr& strtab = sections[dynsym.sh_link];
  std::string syms, names;
  if (!file.ReadAt(dynsym.sh_offset, dynsym.sh_size, &syms) ||
      !file.ReadAt(strtab.sh_offset, strtab.sh_size, &names)) {
    return NotAPlugin(path, "dynamic symbol table past the end of the file");
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
  return false;
}

}  // namespace

absl::StatusOr<bool> ElfExportsSymbol(const std::string& path,
                                      const char* symbol, uint64_t file_size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  const BoundedFile file(fd, file_size);
  ASSIGN_OR_RETURN(const std::vector<Elf64_Shdr> sections,
                   ReadSectionHeaders(file, path));
  for (const Elf64_Shdr& sh : sections) {
    if (sh.sh_type != SHT_DYNSYM) continue;
    ASSIGN_OR_RETURN(const bool defined,
                     DynsymDefines(file, path, sections, sh, symbol));
    if (defined) return true;
  }
  return false;
}

}  // namespace trainyard
