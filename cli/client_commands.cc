#include "cli/client_commands.h"

#include <cstdint>
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/chrome_trace.h"
#include "cli/cli_flags.h"
#include "cli/connect.h"
#include "cli/job_client.h"
#include "cli/job_format.h"
#include "cli/job_stages.h"
#include "cli/submit_spec.h"
#include "cli/watch_job.h"
#include "core/file_util.h"
#include "proto/trainyard.pb.h"

namespace trainyard {
namespace {

// Warns on stderr about stages whose spans were cut or that have not
// reported the step, then says what was written to `out`.
void PrintTraceSummary(const trainyard::v1::GetTraceResponse& trace,
                       const std::string& out) {
  int spans = 0;
  std::vector<std::string> missing;
  std::set<int> have;
  for (const auto& st : trace.stages()) {
    spans += st.spans_size();
    have.insert(st.stage());
    if (st.truncated()) {
      std::cerr << "trainyard trace: stage " << st.stage()
                << " did more than the span limit allows; its trace is cut\n";
    }
  }
  for (int k = 0; k < trace.num_stages(); ++k) {
    if (have.count(k) == 0) missing.push_back(absl::StrCat(k));
  }
  if (!missing.empty()) {
    std::cerr << "trainyard trace: stage(s) " << absl::StrJoin(missing, ", ")
              << " have not reported step " << trace.step() << " (yet)\n";
  }
  std::cerr << "trainyard trace: wrote " << out << ": step " << trace.step()
            << " of " << trace.job_id() << ", " << trace.stages_size()
            << " stage(s), " << spans << " spans (steps " << trace.oldest_step()
            << ".." << trace.newest_step()
            << " are held). Open it in chrome://tracing or "
               "https://ui.perfetto.dev; each stage is drawn from its own "
               "step start (no clock sync between machines).\n";
}

// For a command of one job id (args[2]): the client, or null after
// printing `usage` (other arguments) or why no client could be made (both
// exit status 2).
std::unique_ptr<JobClient> ConnectForJob(const char* command, const char* usage,
                                         const CliFlags& flags,
                                         const std::vector<char*>& args) {
  if (args.size() != 3) {
    std::cerr << usage;
    return nullptr;
  }
  return Connect(command, flags);
}

}  // namespace

int SubmitCommand(const CliFlags& flags) {
  const std::string path = flags.spec;
  if (path.empty()) {
    std::cerr << "trainyard submit: --spec is required\n";
    return 2;
  }
  auto spec = ReadSpecForSubmit(path);
  if (!spec.ok()) {
    std::cerr << "trainyard submit: " << spec.status().message() << "\n";
    return 2;
  }
  std::unique_ptr<JobClient> connected = Connect("submit", flags);
  if (connected == nullptr) return 2;
  JobClient& client = *connected;
  std::string request_id = flags.request_id;
  if (request_id.empty()) request_id = NewRequestId();
  auto job = client.Submit(*spec, request_id, flags.priority);
  if (!job.ok()) {
    const int rc = ReportRpcError("submit", client, job.status());
    if (absl::IsUnavailable(job.status()) ||
        absl::IsDeadlineExceeded(job.status())) {
      // The controller may have stored the job before the reply was lost:
      // the same request id returns that job instead of a second one.
      std::cerr << "trainyard submit: to retry without risking a duplicate "
                   "job, add --request_id "
                << request_id << "\n";
    }
    return rc;
  }
  std::cout << job->job_id() << std::endl;
  std::cerr << "trainyard submit: job " << job->job_id() << " "
            << JobStateName(job->state())
            << (job->reason().empty() ? "" : ": " + job->reason())
            << " (request id " << request_id << ")\n";
  if (!flags.watch) return 0;
  return WatchToEnd(client, job->job_id(), 0, ReconnectWindow(flags));
}

int GetCommand(const CliFlags& flags, const std::vector<char*>& args) {
  std::unique_ptr<JobClient> connected = ConnectForJob(
      "get", "usage: trainyard get JOB_ID [--stages]\n", flags, args);
  if (connected == nullptr) return 2;
  JobClient& client = *connected;
  auto job = client.Get(args[2]);
  if (!job.ok()) return ReportRpcError("get", client, job.status());
  if (flags.get_stages) return PrintStages(client, *job);
  std::cout << ToJson(*job);
  return 0;
}

int ListCommand(const CliFlags& flags) {
  std::vector<trainyard::v1::JobState> states;
  for (absl::string_view name :
       absl::StrSplit(flags.state, ',', absl::SkipEmpty())) {
    trainyard::v1::JobState s;
    if (!trainyard::v1::JobState_Parse(std::string(name), &s)) {
      std::cerr
          << "trainyard list: --state: unknown state \"" << name
          << "\" (QUEUED, RUNNING, RECOVERING, SUCCEEDED, FAILED, CANCELLED)\n";
      return 2;
    }
    states.push_back(s);
  }
  std::unique_ptr<JobClient> connected = Connect("list", flags);
  if (connected == nullptr) return 2;
  JobClient& client = *connected;
  auto resp = client.List(states, flags.page_size, flags.page_token);
  if (!resp.ok()) return ReportRpcError("list", client, resp.status());
  std::cout << absl::StrFormat("%-24s %-10s %-24s %-18s %s\n", "JOB", "STATE",
                               "NAME", "PROGRESS", "REASON");
  for (const auto& job : resp->jobs()) {
    std::cout << absl::StrFormat("%-24s %-10s %-24s %-18s %s\n", job.job_id(),
                                 JobStateName(job.state()), job.spec().name(),
                                 FormatProgress(job), job.reason());
  }
  if (!resp->next_page_token().empty()) {
    std::cout << "more: --page_token=" << resp->next_page_token() << "\n";
  }
  return 0;
}

int CancelCommand(const CliFlags& flags, const std::vector<char*>& args) {
  std::unique_ptr<JobClient> connected = ConnectForJob(
      "cancel", "usage: trainyard cancel JOB_ID [--reason TEXT]\n", flags,
      args);
  if (connected == nullptr) return 2;
  JobClient& client = *connected;
  auto job = client.Cancel(args[2], flags.reason);
  if (!job.ok()) return ReportRpcError("cancel", client, job.status());
  std::cout << job->job_id() << " " << JobStateName(job->state()) << "\n";
  return 0;
}

int WatchCommand(const CliFlags& flags, const std::vector<char*>& args) {
  std::unique_ptr<JobClient> connected = ConnectForJob(
      "watch", "usage: trainyard watch JOB_ID [--from_step N]\n", flags, args);
  if (connected == nullptr) return 2;
  return WatchToEnd(*connected, args[2], flags.from_step,
                    ReconnectWindow(flags));
}

int WorkersCommand(const CliFlags& flags) {
  std::unique_ptr<JobClient> connected = Connect("workers", flags);
  if (connected == nullptr) return 2;
  JobClient& client = *connected;
  auto resp = client.ListWorkers();
  if (!resp.ok()) return ReportRpcError("workers", client, resp.status());
  std::cout << absl::StrFormat("%-8s %-16s %-8s %-22s %-14s %s\n", "WORKER",
                               "NAME", "DEVICE", "PEER", "JOB", "HEARTBEAT");
  for (const auto& w : resp->workers()) {
    const std::string job =
        w.job_id().empty() ? "idle" : absl::StrCat(w.job_id(), "/", w.stage());
    std::cout << absl::StrFormat(
        "%-8s %-16s %-8s %-22s %-14s %d ms ago\n", w.worker_id(), w.name(),
        w.capabilities().device(), w.capabilities().peer_address(), job,
        w.last_heartbeat_ms_ago());
  }
  return 0;
}

int LogsCommand(const CliFlags& flags, const std::vector<char*>& args) {
  std::unique_ptr<JobClient> connected = ConnectForJob(
      "logs", "usage: trainyard logs JOB_ID [--follow]\n", flags, args);
  if (connected == nullptr) return 2;
  JobClient& client = *connected;
  int64_t expected = 0;  // the seq the next line should have
  absl::Status st = client.WatchLogs(
      args[2], flags.follow,
      [&](const trainyard::v1::LogLine& l) {
        if (l.seq() > expected) {
          std::cout << "(" << l.seq() - expected
                    << " line(s) no longer held by the controller)\n";
        }
        expected = l.seq() + 1;
        std::cout << FormatLogLine(l) << std::endl;
      },
      ReconnectWindow(flags));
  if (!st.ok()) return ReportRpcError("logs", client, st);
  return 0;
}

int TraceCommand(const CliFlags& flags, const std::vector<char*>& args) {
  if (args.size() != 3) {
    std::cerr << "usage: trainyard trace JOB_ID [--step N] [--out FILE]\n";
    return 2;
  }
  const int64_t step = flags.step;
  if (step < 0) {
    std::cerr << "trainyard trace: --step must be >= 0 (0 = the newest), got "
              << step << "\n";
    return 2;
  }
  std::unique_ptr<JobClient> connected = Connect("trace", flags);
  if (connected == nullptr) return 2;
  JobClient& client = *connected;
  auto trace = client.GetTrace(args[2], step);
  if (!trace.ok()) return ReportRpcError("trace", client, trace.status());
  std::string out = flags.out;
  if (out.empty()) {
    out = absl::StrCat(trace->job_id(), "-step", trace->step(), ".trace.json");
  }
  absl::Status written = WriteFileAtomically(out, ChromeTraceJson(*trace));
  if (!written.ok()) {
    std::cerr << "trainyard trace: --out " << out << ": " << written.message()
              << "\n";
    return 1;
  }
  PrintTraceSummary(*trace, out);
  std::cout << out << "\n";
  return 0;
}

}  // namespace trainyard
