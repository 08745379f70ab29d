// Frames over a socket: the TCP transport writes each frame (header, the
// tensors' bytes straight from their storage, CRC32C trailer) with
// gathered writes, and reads one back checking every size against
// transport/frame.h's limits before allocating and the checksum at the end
// (docs/TRANSPORT_FRAME.md). Frames are written and read in 256 KiB pieces;
// the CRC of a piece is computed right before it is written (or right after
// it is read), while it is still in cache.
//
// Sockets are non-blocking; deadlines and the stop descriptor are those of
// net/socket_io.h. Errors say what went wrong without naming the peer (the
// caller does).
//
// Thread safety: one writer and one reader per socket.
#ifndef TRAINYARD_TRANSPORT_FRAME_STREAM_H_
#define TRAINYARD_TRANSPORT_FRAME_STREAM_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/tensor.h"
#include "transport/frame.h"

namespace trainyard {

struct Frame {
  FrameHeader header;
  std::vector<Tensor> tensors;  // described by header.tensors, in order
};

// Writes one frame: `header` (EncodeFrameHeader's, for `tensors`), the
// tensors' bytes and the CRC32C trailer over both. Errors are
// net/socket_io.h's WriteAll's.
absl::Status WriteFrame(int fd, const std::string& header,
                        const std::vector<Tensor>& tensors, absl::Time deadline,
                        int stop_fd);

// Reads one frame. Waits for its first byte until `stop_fd` fires
// (Cancelled); the rest must arrive within `io_timeout`. Errors:
// Unavailable "connection closed by the peer between frames (no goodbye:
// ...)" for EOF before a frame, "connection closed in the middle of a frame
// (got N of M bytes)" after part of one; DeadlineExceeded "frame not
// complete within ..."; DataLoss for a header the codec rejects or a
// checksum mismatch.
absl::StatusOr<Frame> ReadFrame(int fd, absl::Duration io_timeout, int stop_fd);

}  // namespace trainyard

#endif  // TRAINYARD_TRANSPORT_FRAME_STREAM_H_
