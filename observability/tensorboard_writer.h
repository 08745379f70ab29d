// TensorBoard event files: every job's scalars under
// <data_dir>/tensorboard/<job_id>/, as TensorBoard's own readers expect
// them: TFRecord framing (length, masked CRC-32C of the length, the
// serialized Event, its masked CRC-32C) around Event messages
// (proto/tensorboard_event.proto), the first one carrying the file version.
//
// Tags: "loss", "lr", "grad_norm", "samples_per_sec", "metrics/<name>" (the
// task plugin's),
// "stage<k>/<forward|backward|comm|idle|optimizer|loss|data_wait>_s" per step;
// "eval/loss", "eval/<name>" per eval. Values are float32 (TensorBoard's
// simple_value).
//
// Thread safety: none; the JobManager calls it under its lock.
#ifndef TRAINYARD_OBSERVABILITY_TENSORBOARD_WRITER_H_
#define TRAINYARD_OBSERVABILITY_TENSORBOARD_WRITER_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "proto/tensorboard_event.pb.h"
#include "proto/trainyard.pb.h"

namespace trainyard {

class TensorboardWriter {
 public:
  // Creates `dir` (and its parents) and a new event file in it,
  // "events.out.tfevents.<unix seconds>.<hostname>.<pid>"; a restarted
  // controller adds a file, TensorBoard reads them all.
  static absl::StatusOr<std::unique_ptr<TensorboardWriter>> Open(
      const std::string& dir);
  ~TensorboardWriter();
  TensorboardWriter(const TensorboardWriter&) = delete;
  TensorboardWriter& operator=(const TensorboardWriter&) = delete;

  const std::string& path() const { return path_; }
  // The scalars of a step or eval event; other events write nothing.
  absl::Status Write(const v1::JobEvent& event);

 private:
  absl::Status WriteStep(const v1::StepMetrics& step);
  absl::Status WriteEval(const v1::EvalMetrics& eval);
  TensorboardWriter(std::string path, FILE* f)
      : path_(std::move(path)), file_(f) {}
  // One record, flushed (a reader sees it at once).
  absl::Status WriteRecord(const tensorboard::Event& event);

  const std::string path_;
  FILE* const file_;
};

// The TFRecord mask of a CRC-32C (what TensorBoard's reader checks).
uint32_t MaskedCrc32c(const void* data, size_t n);

}  // namespace trainyard

#endif  // TRAINYARD_OBSERVABILITY_TENSORBOARD_WRITER_H_
