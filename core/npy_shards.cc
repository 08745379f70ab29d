#include "core/npy_shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/bfloat16.h"
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

}  // namespace

// One .npy file: a read-only shared mapping of all of it, released in the
// destructor, and the identity it had when opened (its descriptor is closed
// once it is mapped).
class NpyShards::MappedFile {
 public:
  // What a batch asks of the kernel for the pages of its rows.
  enum class Advice {
    kWillNeed,  // read them now, all requests in flight at once
    kDontNeed,  // unmap them from this process (they stay in the cache)
  };

  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(
      const std::string& path, const NpyReadOptions& options);

  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() {
    if (base_ != nullptr) ::munmap(base_, size_);
  }

  const std::string& path() const { return path_; }
  const NpyHeader& header() const { return header_; }
  // The array's bytes (header.data_offset into the file).
  const char* data() const { return base_ + header_.data_offset; }

  // DataLoss naming the file when its path no longer names the file Open
  // saw, as it was then.
  absl::Status CheckUnchanged() const;

  // Gives `advice` for the bytes of rows `rows[i].first - first_row` (in
  // ascending order) of `row_bytes` bytes each: one madvise per merged run
  // of their windows (see Window).
  void Advise(const SourceRow* rows, size_t n, int64_t first_row,
              uint64_t row_bytes, Advice advice) const;

 private:
  explicit MappedFile(std::string path) : path_(std::move(path)) {}

  // The file's window [*begin, *end) to advise for bytes [first, last) of
  // data(): their pages for kWillNeed; for kDontNeed, everything a read
  // fault may have mapped with them. A read fault maps more than the page
  // it needs: the whole page-cache folio holding it (up to 2 MiB, aligned
  // in the file) and, by fault-around, the cached pages in the 64 KiB
  // around it. Dropping only the touched pages would leave those resident
  // (measured: most of a source of 1 MiB files), so drop the 2 MiB
  // file-aligned windows of the touched bytes, widened by 64 KiB each side.
  void Window(uint64_t first, uint64_t last, Advice advice, uint64_t* begin,
              uint64_t* end) const;

  std::string path_;
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
    if (err == EMFILE || err == ENFILE) {
      return absl::ResourceExhaustedError(msg);
    }
    return absl::InvalidArgumentError(msg);
  }
  // The mapping outlives the descriptor: a source keeps none open.
  absl::Cleanup close_fd = [fd] { ::close(fd); };
  std::unique_ptr<MappedFile> file(new MappedFile(path));
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
      again.st_dev != st.st_dev || again.st_size != st.st_size ||
      MtimeNs(again) != MtimeNs(st)) {
    return Bad(path, "changed while it was being opened");
  }
  file->device_ = st.st_dev;
  file->inode_ = st.st_ino;
  file->mtime_ns_ = MtimeNs(st);
  file->size_ = static_cast<uint64_t>(st.st_size);
  void* base = ::mmap(nullptr, file->size_, PROT_READ, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const int err = errno;
    const std::string msg = absl::StrCat(path, ": cannot map its ", file->size_,
                                         " bytes: ", std::strerror(err));
    // Every file is one mapping: vm.max_map_count bounds how many.
    if (err == ENOMEM) {
      return absl::ResourceExhaustedError(absl::StrCat(
          msg,
          " (each shard file is one mapping; the process may be at "
          "vm.max_map_count)"));
    }
    return absl::InternalError(msg);
  }
  file->base_ = static_cast<char*>(base);
  // A batch's rows are wherever the shuffle puts them: a page fault must
  // not read around itself (the disk's read_ahead_kb, 8 MiB on some
  // machines, for a row of a few KiB). Each gather asks for exactly its
  // rows' pages instead (MADV_WILLNEED). Advice only: a failure costs speed.
  if (::madvise(base, file->size_, MADV_RANDOM) != 0) {
    LOG(WARNING) << path << ": madvise(MADV_RANDOM): " << std::strerror(errno);
  }
  return file;
}

absl::Status NpyShards::MappedFile::CheckUnchanged() const {
  struct stat st;
  if (::stat(path_.c_str(), &st) != 0) {
    return absl::DataLossError(absl::StrCat(
        path_,
        ": changed since the job opened it (the path no longer names "
        "a file: ",
        std::strerror(errno), ")"));
  }
  std::vector<std::string> changes;
  if (st.st_dev != device_ || st.st_ino != inode_) {
    changes.push_back(absl::StrCat("the path names another file: inode ",
                                   inode_, " -> ", st.st_ino));
  }
  if (static_cast<uint64_t>(st.st_size) != size_) {
    changes.push_back(absl::StrCat("size ", size_, " -> ", st.st_size));
  }
  if (MtimeNs(st) != mtime_ns_) {
    changes.push_back(
        absl::StrCat("mtime ", mtime_ns_, " -> ", MtimeNs(st), " ns"));
  }
  if (changes.empty()) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(path_,
                                          ": changed since the job opened it (",
                                          absl::StrJoin(changes, ", "), ")"));
}

void NpyShards::MappedFile::Window(uint64_t first, uint64_t last, Advice advice,
                                   uint64_t* begin, uint64_t* end) const {
  static const uint64_t kPage = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  // Offsets in the file = offsets in the mapping; never past its last page.
  const uint64_t mapped = (size_ + kPage - 1) / kPage * kPage;
  first += header_.data_offset;
  last += header_.data_offset;
  if (advice == Advice::kWillNeed) {
    *begin = first / kPage * kPage;
    *end = std::min(mapped, (last + kPage - 1) / kPage * kPage);
    return;
  }
  constexpr uint64_t kFolio = uint64_t{2} << 20, kFaultAround = 64 << 10;
  const uint64_t folio_begin = first / kFolio * kFolio;
  *begin = folio_begin > kFaultAround ? folio_begin - kFaultAround : 0;
  *end = std::min(mapped, (last + kFolio - 1) / kFolio * kFolio + kFaultAround);
}

void NpyShards::MappedFile::Advise(const SourceRow* rows, size_t n,
                                   int64_t first_row, uint64_t row_bytes,
                                   Advice advice) const {
  const int how = advice == Advice::kWillNeed ? MADV_WILLNEED : MADV_DONTNEED;
  uint64_t run_begin = 0, run_end = 0;  // merged runs: one call each
  auto flush = [&] {
    if (run_end > run_begin &&
        ::madvise(base_ + run_begin, run_end - run_begin, how) != 0) {
      LOG_FIRST_N(WARNING, 1)
          << path_ << ": madvise("
          << (how == MADV_WILLNEED ? "MADV_WILLNEED" : "MADV_DONTNEED")
          << ") failed: " << std::strerror(errno);
    }
  };
  for (size_t i = 0; i < n; ++i) {
    const uint64_t local = static_cast<uint64_t>(rows[i].first - first_row);
    uint64_t b, e;
    Window(local * row_bytes, (local + 1) * row_bytes, advice, &b, &e);
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
    // [rows, D], float32, float16 or bfloat16 (header().dtype)
    std::unique_ptr<MappedFile> features;
    std::unique_ptr<MappedFile> targets;  // [rows] or [rows, K]
    int64_t rows = 0;
  };
  std::vector<Shard> shards;
  // starts[i]: the source row where shard i begins; starts.back(): the total.
  std::vector<int64_t> starts;
  int64_t num_features = 0;
  DType feature_dtype = DType::kFloat32;  // see NpyShards::feature_dtype
  DType target_dtype = DType::kInt32;
  int64_t target_width = 0;

  uint64_t FeatureRowBytes(const Shard& s) const {
    return num_features * DTypeSize(s.features->header().dtype);
  }
  uint64_t TargetRowBytes() const {
    return std::max<int64_t>(target_width, 1) * DTypeSize(target_dtype);
  }

  // Appends `shard` (its files checked each on its own) after checking it
  // against shard 0, which sets D and the targets' dtype and width; its
  // rows are its features header's. Errors: InvalidArgument naming the
  // file that differs.
  absl::Status Add(Shard shard);

  // Copies row `local` of shard `s` to `x` (one features row of dtype
  // `x_dtype`: float32, or the shard's own) and `y` (one targets row).
  void CopyRow(int s, uint64_t local, DType x_dtype, char* x, char* y) const {
    const Shard& shard = shards[s];
    const uint64_t x_row = FeatureRowBytes(shard), y_row = TargetRowBytes();
    const char* src = shard.features->data() + local * x_row;
    const DType stored = shard.features->header().dtype;
    if (x_dtype == stored) {
      std::memcpy(x, src, x_row);
    } else {
      DCHECK(x_dtype == DType::kFloat32);
      float* out = reinterpret_cast<float*>(x);
      for (int64_t j = 0; j < num_features; ++j) {
        const uint16_t bits = LoadUnaligned<uint16_t>(src + 2 * j);
        out[j] = stored == DType::kFloat16 ? Float16ToFloat(bits)
                                           : Bf16ToFloat(bits);
      }
    }
    std::memcpy(y, shard.targets->data() + local * y_row, y_row);
  }
};

absl::Status NpyShards::Layout::Add(Shard shard) {
  const NpyHeader& x = shard.features->header();
  const NpyHeader& y = shard.targets->header();
  const int64_t width = y.shape.size() == 2 ? y.shape[1] : 0;
  if (shards.empty()) {
    num_features = x.shape[1];
    target_dtype = y.dtype;
    target_width = width;
  } else if (x.shape[1] != num_features) {
    return Bad(shard.features->path(),
               absl::StrCat(x.shape[1], " features per row, but ",
                            shards[0].features->path(), " has ", num_features));
  } else if (y.dtype != target_dtype || width != target_width) {
    return Bad(
        shard.targets->path(),
        absl::StrCat("targets are ", DTypeName(y.dtype), " of width ", width,
                     ", but ", shards[0].targets->path(), "'s are ",
                     DTypeName(target_dtype), " of width ", target_width));
  }
  shard.rows = x.shape[0];
  starts.push_back(starts.back() + shard.rows);
  shards.push_back(std::move(shard));
  return absl::OkStatus();
}

namespace {

// The features' dtype as NpyShardsOptions allow it.
absl::Status CheckFeatureDType(const std::string& path, const NpyHeader& h,
                               bool bfloat16) {
  if (bfloat16) {
    if (h.dtype == DType::kBFloat16) return absl::OkStatus();
    return Bad(path, absl::StrCat("dtype '", h.descr,
                                  "', but features_dtype is bfloat16 "
                                  "(expected '<u2' or '|V2')"));
  }
  if (h.dtype == DType::kBFloat16) {
    return Bad(path, absl::StrCat("dtype '", h.descr,
                                  "' holds 2-byte words: bfloat16 features "
                                  "need features_dtype \"bfloat16\"; "
                                  "otherwise features are float32 or float16"));
  }
  if (h.dtype != DType::kFloat32 && h.dtype != DType::kFloat16) {
    return Bad(path, absl::StrCat("features must be float32 or float16, got ",
                                  DTypeName(h.dtype)));
  }
  return absl::OkStatus();
}

absl::Status CheckFeatures(const std::string& path, const NpyHeader& h,
                           bool bfloat16) {
  RETURN_IF_ERROR(CheckFeatureDType(path, h, bfloat16));
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

// "float32 [256, 8]", or "on cuda:0" for a tensor not in host memory.
std::string DescribeTensor(const Tensor& t) {
  if (!t.device().is_cpu()) return absl::StrCat("on ", t.device().ToString());
  return absl::StrCat(DTypeName(t.dtype()), " ", ShapeToString(t.shape()));
}

}  // namespace

NpyShards::NpyShards(std::shared_ptr<const Layout> layout, int64_t begin,
                     int64_t end)
    : layout_(std::move(layout)), begin_(begin), end_(end) {}

NpyShards::~NpyShards() = default;

absl::StatusOr<std::shared_ptr<const NpyShards>> NpyShards::Open(
    const std::vector<std::string>& features,
    const std::vector<std::string>& targets, const NpyShardsOptions& options) {
  if (features.empty() || features.size() != targets.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "npy shards: need as many target files as feature files, at least "
        "one; got ",
        features.size(), " feature and ", targets.size(), " target files"));
  }
  auto layout = std::make_shared<Layout>();
  layout->starts.push_back(0);
  // Every 2-byte type is read, so that a refusal can say which it was.
  NpyReadOptions half_widths;
  half_widths.float16 = half_widths.bfloat16_words = true;
  bool all_float16 = true;
  for (size_t i = 0; i < features.size(); ++i) {
    for (const std::string* path : {&features[i], &targets[i]}) {
      if (path->empty() || (*path)[0] != '/') {
        return Bad(*path, "shard paths must be absolute");
      }
    }
    Layout::Shard shard;
    ASSIGN_OR_RETURN(shard.features,
                     MappedFile::Open(features[i], half_widths));
    ASSIGN_OR_RETURN(shard.targets,
                     MappedFile::Open(targets[i], NpyReadOptions()));
    const NpyHeader& x = shard.features->header();
    const NpyHeader& y = shard.targets->header();
    RETURN_IF_ERROR(CheckFeatures(features[i], x, options.bfloat16_features));
    RETURN_IF_ERROR(CheckTargets(targets[i], y));
    if (x.shape[0] != y.shape[0]) {
      return absl::InvalidArgumentError(absl::StrCat(
          features[i], " has ", x.shape[0], " rows but its targets ",
          targets[i], " have ", y.shape[0]));
    }
    all_float16 = all_float16 && x.dtype == DType::kFloat16;
    RETURN_IF_ERROR(layout->Add(std::move(shard)));
  }
  layout->feature_dtype = options.bfloat16_features ? DType::kBFloat16
                          : all_float16             ? DType::kFloat16
                                                    : DType::kFloat32;
  const int64_t total = layout->starts.back();
  return std::shared_ptr<const NpyShards>(
      new NpyShards(std::move(layout), 0, total));
}

int64_t NpyShards::num_features() const { return layout_->num_features; }
DType NpyShards::feature_dtype() const { return layout_->feature_dtype; }
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

absl::Status NpyShards::CheckBatchTensors(int64_t batch, const Tensor& features,
                                          const Tensor& targets) const {
  const Layout& layout = *layout_;
  const Shape x_shape = {batch, layout.num_features};
  const DType stored = layout.feature_dtype;
  if (!features.device().is_cpu() || features.shape() != x_shape ||
      (features.dtype() != DType::kFloat32 && features.dtype() != stored)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "npy shards: the features tensor is ", DescribeTensor(features),
        ", but a batch of ", batch, " rows needs a host tensor float32",
        stored == DType::kFloat32 ? ""
                                  : absl::StrCat(" or ", DTypeName(stored)),
        " ", ShapeToString(x_shape)));
  }
  Shape y_shape = {batch};
  if (layout.target_width > 0) y_shape.push_back(layout.target_width);
  if (!targets.device().is_cpu() || targets.shape() != y_shape ||
      targets.dtype() != layout.target_dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "npy shards: the targets tensor is ", DescribeTensor(targets),
        ", but a batch of ", batch, " rows needs a host tensor ",
        DTypeName(layout.target_dtype), " ", ShapeToString(y_shape)));
  }
  return absl::OkStatus();
}

absl::Status NpyShards::SortByShard(const std::vector<int64_t>& rows,
                                    std::vector<SourceRow>* sorted,
                                    std::vector<ShardRun>* runs) const {
  sorted->resize(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] >= num_rows()) {
      return absl::InvalidArgumentError(
          absl::StrCat("npy shards: row ", rows[i], " (batch position ", i,
                       ") is out of range [0, ", num_rows(), ")"));
    }
    (*sorted)[i] = {begin_ + rows[i], static_cast<int64_t>(i)};
  }
  std::sort(sorted->begin(), sorted->end());
  for (size_t i = 0; i < sorted->size();) {
    const int shard = ShardOf((*sorted)[i].first);
    const int64_t shard_end = layout_->starts[shard + 1];
    size_t j = i + 1;
    while (j < sorted->size() && (*sorted)[j].first < shard_end) ++j;
    runs->push_back({shard, i, j});
    i = j;
  }
  return absl::OkStatus();
}

absl::Status NpyShards::GatherInto(const std::vector<int64_t>& rows,
                                   Tensor* features, Tensor* targets) const {
  const Layout& layout = *layout_;
  const int64_t batch = static_cast<int64_t>(rows.size());
  std::vector<SourceRow> sorted;
  std::vector<ShardRun> runs;
  RETURN_IF_ERROR(SortByShard(rows, &sorted, &runs));
  RETURN_IF_ERROR(CheckBatchTensors(batch, *features, *targets));
  if (batch == 0) return absl::OkStatus();
  for (const ShardRun& run : runs) {
    RETURN_IF_ERROR(layout.shards[run.shard].features->CheckUnchanged());
    RETURN_IF_ERROR(layout.shards[run.shard].targets->CheckUnchanged());
  }
  // Every file's read-ahead before any copy, so that the kernel has the
  // whole batch's reads in flight at once.
  const uint64_t y_row = layout.TargetRowBytes();
  auto advise = [&](MappedFile::Advice advice) {
    for (const ShardRun& run : runs) {
      const Layout::Shard& shard = layout.shards[run.shard];
      const int64_t first = layout.starts[run.shard];
      shard.features->Advise(&sorted[run.begin], run.end - run.begin, first,
                             layout.FeatureRowBytes(shard), advice);
      shard.targets->Advise(&sorted[run.begin], run.end - run.begin, first,
                            y_row, advice);
    }
  };
  advise(MappedFile::Advice::kWillNeed);
  const DType x_dtype = features->dtype();
  const uint64_t x_out = layout.num_features * DTypeSize(x_dtype);
  char* x = static_cast<char*>(features->raw_data());
  char* y = static_cast<char*>(targets->raw_data());
  for (const ShardRun& run : runs) {
    for (size_t i = run.begin; i < run.end; ++i) {
      const auto [row, position] = sorted[i];
      layout.CopyRow(run.shard, row - layout.starts[run.shard], x_dtype,
                     x + position * x_out, y + position * y_row);
    }
  }
  advise(MappedFile::Advice::kDontNeed);
  return absl::OkStatus();
}

absl::StatusOr<std::pair<Tensor, Tensor>> NpyShards::Gather(
    const std::vector<int64_t>& rows) const {
  const int64_t batch = static_cast<int64_t>(rows.size());
  Shape y_shape = {batch};
  if (layout_->target_width > 0) y_shape.push_back(layout_->target_width);
  ASSIGN_OR_RETURN(Tensor x, Tensor::Create(DType::kFloat32,
                                            {batch, layout_->num_features}));
  ASSIGN_OR_RETURN(Tensor y, Tensor::Create(layout_->target_dtype, y_shape));
  RETURN_IF_ERROR(GatherInto(rows, &x, &y));
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
