#include "observability/tensorboard_writer.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/crc32c.h"
#include "core/file_util.h"
#include "core/host_info.h"
#include "core/status_macros.h"

namespace trainyard {
namespace {

double WallTime() {
  return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
}

void Add(tensorboard::Summary* s, const std::string& tag, double v) {
  tensorboard::SummaryValue* value = s->add_value();
  value->set_tag(tag);
  value->set_simple_value(static_cast<float>(v));
}

void PutLe(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i)
    out->push_back(static_cast<char>(v >> (8 * i)));
}

}  // namespace

uint32_t MaskedCrc32c(const void* data, size_t n) {
  const uint32_t crc = Crc32cExtend(0, data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

absl::StatusOr<std::unique_ptr<TensorboardWriter>> TensorboardWriter::Open(
    const std::string& dir) {
  RETURN_IF_ERROR(CreateDirectories(dir));
  const std::string path = absl::StrCat(dir, "/events.out.tfevents.",
                                        absl::ToUnixSeconds(absl::Now()), ".",
                                        Hostname(), ".", getpid());
  FILE* f = std::fopen(path.c_str(), "ab");
  if (f == nullptr) {
    return absl::InternalError(
        absl::StrCat(path, ": cannot create: ", std::strerror(errno)));
  }
  std::unique_ptr<TensorboardWriter> w(new TensorboardWriter(path, f));
  tensorboard::Event first;
  first.set_wall_time(WallTime());
  first.set_file_version("brain.Event:2");
  RETURN_IF_ERROR(w->WriteRecord(first));
  return w;
}

TensorboardWriter::~TensorboardWriter() { std::fclose(file_); }

absl::Status TensorboardWriter::WriteRecord(const tensorboard::Event& event) {
  const std::string data = event.SerializeAsString();
  std::string record;
  std::string len;
  PutLe(&len, data.size(), 8);
  record += len;
  PutLe(&record, MaskedCrc32c(len.data(), len.size()), 4);
  record += data;
  PutLe(&record, MaskedCrc32c(data.data(), data.size()), 4);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() ||
      std::fflush(file_) != 0) {
    return absl::InternalError(
        absl::StrCat(path_, ": write failed: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status TensorboardWriter::Write(const v1::JobEvent& event) {
  if (event.has_step()) return WriteStep(event.step());
  if (event.has_eval()) return WriteEval(event.eval());
  return absl::OkStatus();
}

absl::Status TensorboardWriter::WriteStep(const v1::StepMetrics& step) {
  tensorboard::Event event;
  event.set_wall_time(WallTime());
  event.set_step(step.step());
  tensorboard::Summary* s = event.mutable_summary();
  Add(s, "loss", step.loss());
  Add(s, "lr", step.lr());
  Add(s, "grad_norm", step.grad_norm());
  Add(s, "samples_per_sec", step.samples_per_sec());
  for (const auto& [name, value] : step.metrics()) {
    Add(s, absl::StrCat("metrics/", name), value);
  }
  for (const v1::StageTiming& t : step.stages()) {
    const std::string p = absl::StrCat("stage", t.stage(), "/");
    Add(s, p + "forward_s", t.forward_s());
    Add(s, p + "backward_s", t.backward_s());
    Add(s, p + "comm_s", t.comm_s());
    Add(s, p + "idle_s", t.idle_s());
    Add(s, p + "optimizer_s", t.optimizer_s());
    Add(s, p + "loss_s", t.loss_s());
    Add(s, p + "data_wait_s", t.data_wait_s());
    Add(s, p + "device_syncs", static_cast<double>(t.syncs()));
    Add(s, p + "device_copy_bytes",
        static_cast<double>(t.h2d_bytes() + t.d2h_bytes()));
  }
  return WriteRecord(event);
}

absl::Status TensorboardWriter::WriteEval(const v1::EvalMetrics& eval) {
  tensorboard::Event event;
  event.set_wall_time(WallTime());
  event.set_step(eval.step());
  tensorboard::Summary* s = event.mutable_summary();
  Add(s, "eval/loss", eval.loss());
  for (const auto& [name, value] : eval.metrics()) {
    Add(s, absl::StrCat("eval/", name), value);
  }
  return WriteRecord(event);
}

}  // namespace trainyard
