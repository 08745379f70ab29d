#include "cli/watch_job.h"

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <iostream>
#include <string>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "cli/connect.h"
#include "cli/job_client.h"
#include "cli/job_format.h"
#include "proto/trainyard.pb.h"

namespace trainyard {

WatchPrinter::WatchPrinter(int64_t total_steps, int64_t batch_size)
    : total_(total_steps), batch_(batch_size), tty_(isatty(1) != 0) {}

void WatchPrinter::operator()(const trainyard::v1::JobEvent& e) {
  if (e.has_state()) {
    EndBar();
    std::cout << "job " << e.job_id() << ": "
              << JobStateName(e.state().state());
    if (!e.state().reason().empty()) std::cout << ": " << e.state().reason();
    std::cout << std::endl;
  } else if (e.has_step()) {
    PrintStep(e.step());
  } else if (e.has_eval()) {
    EndBar();
    const auto& ev = e.eval();
    std::cout << absl::StrFormat("eval after step %d: loss=%.6g samples=%d",
                                 ev.step(), ev.loss(), ev.samples())
              << FormatMetrics(ev.metrics(), "", ev.loss()) << std::endl;
    last_eval_ = ev;
    has_eval_ = true;
  } else if (e.has_note()) {
    // What the service decided on the job's behalf (e.g. the transport
    // between its stages and why).
    EndBar();
    std::cout << "note (stage " << e.note().stage() << "): " << e.note().text()
              << std::endl;
  } else if (e.has_recovery()) {
    EndBar();
    PrintRecovery(e.recovery());
  } else if (e.has_progress()) {
    PrintProgress(e.progress());
  }
}

void WatchPrinter::PrintProgress(const trainyard::v1::InferProgress& p) {
  const std::string line = absl::StrFormat(
      "rows %d/%d (shards %d/%d) %.0f rows/s ETA %s", p.rows_done(),
      p.rows_total(), p.shards_done(), p.shards_total(), p.rows_per_sec(),
      FormatEta(p.eta_seconds()));
  if (tty_) {
    const int width = 30;
    const int filled =
        p.rows_total() > 0
            ? static_cast<int>(width * p.rows_done() / p.rows_total())
            : 0;
    std::cout << "\r[" << std::string(filled, '#')
              << std::string(width - filled, '-') << "] " << line << "\x1b[K"
              << std::flush;
    bar_open_ = true;
  } else {
    std::cout << line << std::endl;
  }
}

void WatchPrinter::PrintStep(const trainyard::v1::StepMetrics& m) {
  const double rate =
      batch_ > 0 && m.samples_per_sec() > 0 ? m.samples_per_sec() / batch_ : 0;
  const double eta = rate > 0 ? (total_ - m.step()) / rate : -1;
  if (tty_) {
    const int width = 30;
    const int filled =
        total_ > 0 ? static_cast<int>(width * m.step() / total_) : 0;
    std::cout << "\r[" << std::string(filled, '#')
              << std::string(width - filled, '-') << "] "
              << absl::StrFormat(
                     "step %d/%d loss %.4f lr %.3g %.0f samples/s ETA %s",
                     m.step(), total_, m.loss(), m.lr(), m.samples_per_sec(),
                     FormatEta(eta))
              << "\x1b[K" << std::flush;
    bar_open_ = true;
  } else {
    std::cout << absl::StrFormat(
                     "step %d/%d loss=%.6g lr=%.6g grad_norm=%.6g "
                     "samples_per_sec=%.1f eta=%s",
                     m.step(), total_, m.loss(), m.lr(), m.grad_norm(),
                     m.samples_per_sec(), FormatEta(eta))
              << FormatMetrics(m.metrics(), "", m.loss()) << std::endl;
  }
}

void WatchPrinter::PrintRecovery(const trainyard::v1::JobRecovery& r) {
  std::cout << absl::StrFormat(
                   "restart %d: resumed after step %d (the loss was noticed "
                   "after step %d; rescheduled in %.2f s, restored in %.2f s) "
                   "on %s; cause: %s",
                   r.attempt(), r.resume_step(), r.detected_step(),
                   r.reschedule_s(), r.restore_s(),
                   absl::StrJoin(r.workers(), ","), r.cause())
            << std::endl;
}

void WatchPrinter::EndBar() {
  if (bar_open_) std::cout << std::endl;
  bar_open_ = false;
}

int WatchToEnd(JobClient& client, const std::string& job_id, int64_t from_step,
               absl::Duration reconnect,
               const std::function<void(const WatchPrinter&)>& done,
               const std::atomic<bool>* stop) {
  auto job = client.Get(job_id);
  if (!job.ok()) return ReportRpcError("watch", client, job.status());
  WatchPrinter printer(job->spec().steps(), job->spec().data().batch_size());
  auto end = client.Watch(
      job_id, from_step, [&](const trainyard::v1::JobEvent& e) { printer(e); },
      reconnect, stop);
  printer.EndBar();
  if (done) done(printer);
  if (!end.ok()) return ReportRpcError("watch", client, end.status());
  return end->state() == trainyard::v1::SUCCEEDED ? 0 : 1;
}

}  // namespace trainyard
