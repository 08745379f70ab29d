#include "core/npy_shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/npy.h"
#include "core/status_macros.h"
#include "core/unaligned.h"
#include "glog/logging.h"

namespace trainyard {
namespace {

absl::Status Bad(const std::string& path, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", why));
}

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 +
         st.st_mtim.tv_nsec;
}

// A byte range [first, second) of a file.
using ByteRange = std::pair<uint64_t, uint64_t>;

}  // namespace

// One .npy file: its descriptor and a read-only shared mapping of all of
// it, released in the destructor, and the identity it had when opened.
class NpyShards::MappedFile {
 public:
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(
      const std::string& path, const NpyReadOptions& options);

  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() {
    if (base_ != nullptr) ::munmap(base_, size_);
    ::close(fd_);
  }

  const std::string& path() const { return path_; }
  const NpyHeader& header() const { return header_; }
  // The array's bytes (header.data_offset into the file).
  const char* data() const { return base_ + header_.data_offset; }

  // DataLoss naming the file when it is no longer the file Open saw.
  absl::Status CheckUnchanged() const;

  // Drops this process's pages that hold any of `ranges` (offsets into
  // data()), and those around them the kernel may have mapped with them;
  // `ranges` is reordered. The pages stay in the page cache.
  void DropPages(std::vector<ByteRange>* ranges) const;

 private:
  MappedFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}

  std::string path_;
  int fd_;
  char* base_ = nullptr;
  uint64_t size_ = 0;
  NpyHeader header_;
  dev_t device_ = 0;
  ino_t inode_ = 0;
  int64_t mtime_ns_ = 0;
};

absl::StatusOr<std::unique_ptr<NpyShards::MappedFile>>
NpyShards::MappedFile::Open(const std::string& path,
                            const NpyReadOptions& options) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    std::string msg = absl::StrCat(path, ": cannot open: ", std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(msg);
    if (err == EACCES) return absl::PermissionDeniedError(msg);
    // Two descriptors stay open per pair: many pairs can reach the limit.
    if (err == EMFILE || err == ENFILE) {
      return absl::ResourceExhaustedError(msg);
    }
    return absl::InvalidArgumentError(msg);
  }
  std::unique_ptr<MappedFile> file(new MappedFile(path, fd));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return absl::InternalError(
        absl::StrCat(path, ": cannot stat: ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) return Bad(path, "not a regular file");
  ASSIGN_OR_RETURN(file->header_, ReadNpyHeader(path, options));
  // ReadNpyHeader looked the path up again: it must have read this file.
  struct stat again;
  if (::stat(path.c_str(), &again) != 0 || again.st_ino != st.st_ino ||
      again.st_dev != st.st_dev || again.st_size != st.st_size) {
    return Bad(path, "changed while it was being opened");
  }
  file->device_ = st.st_dev;
  file->inode_ = st.st_ino;
  file->mtime_ns_ = MtimeNs(st);
  file->size_ = static_cast<uint64_t>(st.st_size);
  void* base = ::mmap(nullptr, file->size_, PROT_READ, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    return absl::InternalError(absl::StrCat(path, ": cannot map its ",
                                            file->size_,
                                            " bytes: ", std::strerror(errno)));
  }
  file->base_ = static_cast<char*>(base);
  return file;
}

absl::Status NpyShards::MappedFile::CheckUnchanged() const {
  std::vector<std::string> changes;
  struct stat st;
  if (::fstat(fd_, &st) != 0) {
    changes.push_back(absl::StrCat("cannot stat: ", std::strerror(errno)));
  } else {
    if (static_cast<uint64_t>(st.st_size) != size_) {
      changes.push_back(absl::StrCat("size ", size_, " -> ", st.st_size));
    }
    if (MtimeNs(st) != mtime_ns_) {
      changes.push_back(
          absl::StrCat("mtime ", mtime_ns_, " -> ", MtimeNs(st), " ns"));
    }
  }
  struct stat now;
  if (::stat(path_.c_str(), &now) != 0) {
    changes.push_back(absl::StrCat("the path no longer names a file: ",
                                   std::strerror(errno)));
  } else if (now.st_dev != device_ || now.st_ino != inode_) {
    changes.push_back(absl::StrCat("the path names another file: inode ",
                                   inode_, " -> ", now.st_ino));
  }
  if (changes.empty()) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(path_,
                                          ": changed since the job opened it (",
                                          absl::StrJoin(changes, ", "), ")"));
}

void NpyShards::MappedFile::DropPages(std::vector<ByteRange>* ranges) const {
  // A read fault maps more than the page it needs: the whole page-cache
  // folio holding it (up to 2 MiB, aligned in the file) and, by
  // fault-around, the cached pages in the 64 KiB around it. Dropping only
  // the touched pages would leave those resident (measured: most of a
  // source of 1 MiB files), so drop the 2 MiB file-aligned windows of the
  // touched bytes, widened by 64 KiB each side.
  constexpr uint64_t kFolio = uint64_t{2} << 20, kFaultAround = 64 << 10;
  static const uint64_t kPage = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  std::sort(ranges->begin(), ranges->end());
  // Offsets in the file = offsets in the mapping; never past its last page.
  const uint64_t mapped = (size_ + kPage - 1) / kPage * kPage;
  uint64_t run_begin = 0, run_end = 0;  // merged runs: one call each
  auto flush = [&] {
    if (run_end > run_begin &&
        ::madvise(base_ + run_begin, run_end - run_begin, MADV_DONTNEED) != 0) {
      LOG_FIRST_N(WARNING, 1)
          << path_
          << ": madvise(MADV_DONTNEED) failed: " << std::strerror(errno);
    }
  };
  for (const ByteRange& r : *ranges) {
    const uint64_t first = header_.data_offset + r.first;
    const uint64_t last = header_.data_offset + r.second;
    const uint64_t folio_begin = first / kFolio * kFolio;
    const uint64_t b =
        folio_begin > kFaultAround ? folio_begin - kFaultAround : 0;
    const uint64_t e =
        std::min(mapped, (last + kFolio - 1) / kFolio * kFolio + kFaultAround);
    if (b > run_end) {
      flush();
      run_begin = b;
    }
    run_end = std::max(run_end, e);
  }
  flush();
}

// One pair of files and where its rows start in the whole source.
struct NpyShards::Layout {
  struct Shard {
    std::unique_ptr<MappedFile> features;  // [rows, D], float32 or float16
    std::unique_ptr<MappedFile> targets;   // [rows] or [rows, K]
    int64_t rows = 0;
  };
  std::vector<Shard> shards;
  // starts[i]: the source row where shard i begins; starts.back(): the total.
  std::vector<int64_t> starts;
  int64_t num_features = 0;
  DType target_dtype = DType::kInt32;
  int64_t target_width = 0;

  uint64_t FeatureRowBytes(const Shard& s) const {
    return num_features * (s.features->header().float16 ? 2 : 4);
  }
  uint64_t TargetRowBytes() const {
    return std::max<int64_t>(target_width, 1) * DTypeSize(target_dtype);
  }

  // Copies row `local` of shard `s` to `x` ([D] float32) and `y` (one
  // target row), noting the file bytes read in `copied` (two lists per
  // shard: features, targets).
  void CopyRow(int s, uint64_t local, float* x, char* y,
               std::vector<std::vector<ByteRange>>* copied) const {
    const Shard& shard = shards[s];
    const uint64_t x_row = FeatureRowBytes(shard), y_row = TargetRowBytes();
    const char* src = shard.features->data() + local * x_row;
    if (shard.features->header().float16) {
      for (int64_t j = 0; j < num_features; ++j) {
        x[j] = Float16ToFloat(LoadUnaligned<uint16_t>(src + 2 * j));
      }
    } else {
      std::memcpy(x, src, x_row);
    }
    std::memcpy(y, shard.targets->data() + local * y_row, y_row);
    (*copied)[2 * s].emplace_back(local * x_row, (local + 1) * x_row);
    (*copied)[2 * s + 1].emplace_back(local * y_row, (local + 1) * y_row);
  }
};

namespace {

absl::Status CheckFeatures(const std::string& path, const NpyHeader& h) {
  if (h.dtype != DType::kFloat32) {
    return Bad(path, absl::StrCat("features must be float32 or float16, got ",
                                  DTypeName(h.dtype)));
  }
  if (h.shape.size() != 2) {
    return Bad(path,
               absl::StrCat("features must be 2-D [rows, features], got shape ",
                            ShapeToString(h.shape)));
  }
  if (h.shape[1] < 1) {
    return Bad(path, absl::StrCat("features have no columns (shape ",
                                  ShapeToString(h.shape), ")"));
  }
  if (h.shape[0] < 1) {
    return Bad(path, absl::StrCat("has no rows (shape ", ShapeToString(h.shape),
                                  "); empty shards are not allowed"));
  }
  return absl::OkStatus();
}

absl::Status CheckTargets(const std::string& path, const NpyHeader& h) {
  if (h.dtype == DType::kInt32 || h.dtype == DType::kInt64) {
    if (h.shape.size() == 1) return absl::OkStatus();
    return Bad(path,
               absl::StrCat(DTypeName(h.dtype),
                            " targets (class ids) must be 1-D [rows], got "
                            "shape ",
                            ShapeToString(h.shape)));
  }
  if (h.shape.size() != 2 || h.shape[1] < 1) {
    return Bad(path,
               absl::StrCat("float32 targets must be 2-D [rows, K] with K >= "
                            "1, got shape ",
                            ShapeToString(h.shape)));
  }
  return absl::OkStatus();
}

}  // namespace

NpyShards::NpyShards(std::shared_ptr<const Layout> layout, int64_t begin,
                     int64_t end)
    : layout_(std::move(layout)), begin_(begin), end_(end) {}

NpyShards::~NpyShards() = default;

absl::StatusOr<std::shared_ptr<const NpyShards>> NpyShards::Open(
    const std::vector<std::string>& features,
    const std::vector<std::string>& targets) {
  if (features.empty() || features.size() != targets.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "npy shards: need as many target files as feature files, at least "
        "one; got ",
        features.size(), " feature and ", targets.size(), " target files"));
  }
  auto layout = std::make_shared<Layout>();
  layout->starts.push_back(0);
  NpyReadOptions float16_ok;
  float16_ok.float16 = true;
  for (size_t i = 0; i < features.size(); ++i) {
    for (const std::string* path : {&features[i], &targets[i]}) {
      if (path->empty() || (*path)[0] != '/') {
        return Bad(*path, "shard paths must be absolute");
      }
    }
    Layout::Shard shard;
    ASSIGN_OR_RETURN(shard.features, MappedFile::Open(features[i], float16_ok));
    ASSIGN_OR_RETURN(shard.targets,
                     MappedFile::Open(targets[i], NpyReadOptions()));
    const NpyHeader& x = shard.features->header();
    const NpyHeader& y = shard.targets->header();
    RETURN_IF_ERROR(CheckFeatures(features[i], x));
    RETURN_IF_ERROR(CheckTargets(targets[i], y));
    if (x.shape[0] != y.shape[0]) {
      return absl::InvalidArgumentError(absl::StrCat(
          features[i], " has ", x.shape[0], " rows but its targets ",
          targets[i], " have ", y.shape[0]));
    }
    const int64_t width = y.shape.size() == 2 ? y.shape[1] : 0;
    if (i == 0) {
      layout->num_features = x.shape[1];
      layout->target_dtype = y.dtype;
      layout->target_width = width;
    } else if (x.shape[1] != layout->num_features) {
      return Bad(features[i],
                 absl::StrCat(x.shape[1], " features per row, but ",
                              features[0], " has ", layout->num_features));
    } else if (y.dtype != layout->target_dtype ||
               width != layout->target_width) {
      return Bad(targets[i],
                 absl::StrCat("targets are ", DTypeName(y.dtype), " of width ",
                              width, ", but ", targets[0], "'s are ",
                              DTypeName(layout->target_dtype), " of width ",
                              layout->target_width));
    }
    shard.rows = x.shape[0];
    layout->starts.push_back(layout->starts.back() + shard.rows);
    layout->shards.push_back(std::move(shard));
  }
  const int64_t total = layout->starts.back();
  return std::shared_ptr<const NpyShards>(
      new NpyShards(std::move(layout), 0, total));
}

int64_t NpyShards::num_features() const { return layout_->num_features; }
DType NpyShards::target_dtype() const { return layout_->target_dtype; }
int64_t NpyShards::target_width() const { return layout_->target_width; }

int NpyShards::ShardOf(int64_t row) const {
  const std::vector<int64_t>& starts = layout_->starts;
  return static_cast<int>(std::upper_bound(starts.begin(), starts.end(), row) -
                          starts.begin() - 1);
}

int NpyShards::num_shards() const {
  if (num_rows() == 0) return 0;
  return ShardOf(end_ - 1) - ShardOf(begin_) + 1;
}

uint64_t NpyShards::bytes() const {
  if (num_rows() == 0) return 0;
  uint64_t total = 0;
  for (int i = ShardOf(begin_); i <= ShardOf(end_ - 1); ++i) {
    const Layout::Shard& s = layout_->shards[i];
    const int64_t first = std::max(begin_, layout_->starts[i]);
    const int64_t last = std::min(end_, layout_->starts[i + 1]);
    total += static_cast<uint64_t>(last - first) *
             (layout_->FeatureRowBytes(s) + layout_->TargetRowBytes());
  }
  return total;
}

absl::StatusOr<std::pair<Tensor, Tensor>> NpyShards::Gather(
    const std::vector<int64_t>& rows) const {
  const Layout& layout = *layout_;
  const int64_t batch = static_cast<int64_t>(rows.size());
  std::vector<int> shard_of(batch);
  std::vector<bool> touched(layout.shards.size(), false);
  for (int64_t i = 0; i < batch; ++i) {
    if (rows[i] < 0 || rows[i] >= num_rows()) {
      return absl::InvalidArgumentError(
          absl::StrCat("npy shards: row ", rows[i], " (batch position ", i,
                       ") is out of range [0, ", num_rows(), ")"));
    }
    shard_of[i] = ShardOf(begin_ + rows[i]);
    touched[shard_of[i]] = true;
  }
  for (size_t s = 0; s < touched.size(); ++s) {
    if (!touched[s]) continue;
    RETURN_IF_ERROR(layout.shards[s].features->CheckUnchanged());
    RETURN_IF_ERROR(layout.shards[s].targets->CheckUnchanged());
  }
  const int64_t d = layout.num_features;
  Shape y_shape = {batch};
  if (layout.target_width > 0) y_shape.push_back(layout.target_width);
  ASSIGN_OR_RETURN(Tensor x, Tensor::Create(DType::kFloat32, {batch, d}));
  ASSIGN_OR_RETURN(Tensor y, Tensor::Create(layout.target_dtype, y_shape));
  std::vector<std::vector<ByteRange>> copied(2 * layout.shards.size());
  const uint64_t y_row = layout.TargetRowBytes();
  for (int64_t i = 0; i < batch; ++i) {
    const int s = shard_of[i];
    layout.CopyRow(s, begin_ + rows[i] - layout.starts[s],
                   x.data<float>() + i * d,
                   static_cast<char*>(y.raw_data()) + i * y_row, &copied);
  }
  for (size_t s = 0; s < layout.shards.size(); ++s) {
    layout.shards[s].features->DropPages(&copied[2 * s]);
    layout.shards[s].targets->DropPages(&copied[2 * s + 1]);
  }
  return std::make_pair(std::move(x), std::move(y));
}

std::shared_ptr<const NpyShards> NpyShards::Slice(int64_t begin,
                                                  int64_t end) const {
  CHECK(0 <= begin && begin <= end && end <= num_rows())
      << "NpyShards::Slice(" << begin << ", " << end << ") of " << num_rows()
      << " rows";
  return std::shared_ptr<const NpyShards>(
      new NpyShards(layout_, begin_ + begin, begin_ + end));
}

}  // namespace trainyard
