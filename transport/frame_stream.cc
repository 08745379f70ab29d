#include "transport/frame_stream.h"

#include <sys/uio.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "core/crc32c.h"
#include "core/status_macros.h"
#include "net/socket_io.h"

namespace trainyard {
namespace {

constexpr size_t kChunk = 256 << 10;

// Reads the rest of a frame once its first byte is in, within `io_timeout`,
// and words each error with how far it got ("(got 50 of 120 bytes)").
class FrameBodyReader {
 public:
  FrameBodyReader(int fd, absl::Duration io_timeout, int stop_fd)
      : fd_(fd),
        io_timeout_(io_timeout),
        stop_fd_(stop_fd),
        deadline_(absl::Now() + io_timeout) {}

  // The first byte, read before the deadline started.
  void CountFirstByte() { got_ = 1; }
  // The frame's whole size, once its prefix is decoded.
  void set_total(uint64_t total) { total_ = total; }

  absl::Status Read(char* buf, size_t n) {
    const absl::Status s = ReadFull(fd_, buf, n, deadline_, stop_fd_, &got_);
    return s.ok() ? s : MidFrame(s);
  }

  // `s`, a failure partway through the frame, saying how far it got.
  absl::Status MidFrame(const absl::Status& s) const {
    const std::string of = total_ == 0 ? std::string("a frame prefix of ") +
                                             std::to_string(kFramePrefixSize)
                                       : std::to_string(total_);
    if (absl::IsCancelled(s)) return s;
    if (absl::IsDeadlineExceeded(s)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "frame not complete within ", absl::FormatDuration(io_timeout_),
          " (got ", got_, " of ", of, " bytes)"));
    }
    if (s.message() == "connection closed") {
      return absl::UnavailableError(
          absl::StrCat("connection closed in the middle of a frame (got ", got_,
                       " of ", of, " bytes)"));
    }
    return absl::UnavailableError(
        absl::StrCat(s.message(), " (got ", got_, " of ", of, " bytes)"));
  }

 private:
  const int fd_;
  const absl::Duration io_timeout_;
  const int stop_fd_;
  const absl::Time deadline_;
  size_t got_ = 0;
  uint64_t total_ = 0;  // 0 until the prefix is decoded
};

// Reads the tensors `descs` describe, extending *crc over their bytes.
absl::StatusOr<std::vector<Tensor>> ReadTensors(
    const std::vector<TensorDesc>& descs, FrameBodyReader* reader,
    uint32_t* crc) {
  std::vector<Tensor> tensors;
  for (const TensorDesc& d : descs) {
    absl::StatusOr<Tensor> created = Tensor::Create(d.dtype, d.shape);
    if (!created.ok()) return reader->MidFrame(created.status());
    Tensor t = *std::move(created);
    char* p = static_cast<char*>(t.raw_data());
    size_t n = t.nbytes();
    while (n > 0) {
      const size_t take = std::min(n, kChunk);
      RETURN_IF_ERROR(reader->Read(p, take));
      *crc = Crc32cExtend(*crc, p, take);
      p += take;
      n -= take;
    }
    tensors.push_back(std::move(t));
  }
  return tensors;
}

}  // namespace

absl::Status WriteFrame(int fd, const std::string& header,
                        const std::vector<Tensor>& tensors, absl::Time deadline,
                        int stop_fd) {
  uint32_t crc = Crc32cExtend(0, header.data(), header.size());
  std::vector<iovec> batch = {
      {const_cast<char*>(header.data()), header.size()}};
  size_t batch_bytes = header.size();
  for (const Tensor& t : tensors) {
    const char* p = static_cast<const char*>(t.raw_data());
    size_t n = t.nbytes();
    while (n > 0) {
      const size_t take =
          std::min(n, kChunk - std::min(batch_bytes, kChunk - 1));
      crc = Crc32cExtend(crc, p, take);
      batch.push_back({const_cast<char*>(p), take});
      batch_bytes += take;
      p += take;
      n -= take;
      if (batch_bytes >= kChunk) {
        RETURN_IF_ERROR(WriteAll(fd, &batch, deadline, stop_fd));
        batch.clear();
        batch_bytes = 0;
      }
    }
  }
  char trailer[kFrameTrailerSize];
  std::memcpy(trailer, &crc, sizeof(crc));
  batch.push_back({trailer, sizeof(trailer)});
  return WriteAll(fd, &batch, deadline, stop_fd);
}

absl::StatusOr<Frame> ReadFrame(int fd, absl::Duration io_timeout,
                                int stop_fd) {
  char prefix_bytes[kFramePrefixSize];
  size_t got = 0;
  // The first byte may take as long as the peer likes.
  const absl::Status first =
      ReadFull(fd, prefix_bytes, 1, absl::InfiniteFuture(), stop_fd, &got);
  if (!first.ok()) {
    if (absl::IsUnavailable(first) && got == 0 &&
        first.message() == "connection closed") {
      return absl::UnavailableError(
          "connection closed by the peer between frames (no goodbye: the "
          "peer process died or aborted)");
    }
    return first;
  }
  FrameBodyReader reader(fd, io_timeout, stop_fd);
  reader.CountFirstByte();
  RETURN_IF_ERROR(reader.Read(prefix_bytes + 1, kFramePrefixSize - 1));
  ASSIGN_OR_RETURN(const FramePrefix prefix, DecodeFramePrefix(prefix_bytes));
  const uint64_t total =
      prefix.header_size + prefix.payload_size + kFrameTrailerSize;
  reader.set_total(total);
  std::string rest(prefix.header_size - kFramePrefixSize, '\0');
  RETURN_IF_ERROR(reader.Read(rest.data(), rest.size()));
  Frame frame;
  ASSIGN_OR_RETURN(frame.header, DecodeFrameHeader(prefix, rest));
  uint32_t crc = Crc32cExtend(0, prefix_bytes, kFramePrefixSize);
  crc = Crc32cExtend(crc, rest.data(), rest.size());
  ASSIGN_OR_RETURN(frame.tensors,
                   ReadTensors(frame.header.tensors, &reader, &crc));
  uint32_t expected;
  RETURN_IF_ERROR(
      reader.Read(reinterpret_cast<char*>(&expected), sizeof(expected)));
  if (expected != crc) {
    return absl::DataLossError(absl::StrFormat(
        "checksum mismatch in a %s frame of %d bytes (crc32c 0x%08x, trailer "
        "says 0x%08x)",
        FrameKindName(prefix.kind), total, crc, expected));
  }
  return frame;
}

}  // namespace trainyard
