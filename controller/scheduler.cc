#include "controller/scheduler.h"

#include <algorithm>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/device.h"

namespace trainyard {
namespace {

std::string Plural(int n, const std::string& kind) {
  return absl::StrCat(n, " idle ", kind, n == 1 ? " worker" : " workers");
}

}  // namespace

std::string JobDeviceKind(const std::string& job_device) {
  if (job_device.empty() || job_device == "cpu") return "cpu";
  return job_device;
}

std::string WorkerDeviceKind(const std::string& worker_device) {
  if (worker_device.empty()) return "cpu";
  absl::StatusOr<Device> d = ParseDevice(worker_device);
  // An unparseable device matches no job's kind.
  return d.ok() ? d->KindName() : worker_device;
}

SchedDecision Schedule(std::vector<SchedJob> queued,
                       const std::vector<SchedWorker>& workers) {
  std::stable_sort(queued.begin(), queued.end(),
                   [](const SchedJob& a, const SchedJob& b) {
                     if (a.priority != b.priority) {
                       return a.priority > b.priority;
                     }
                     return a.order < b.order;
                   });
  std::vector<bool> taken(workers.size(), false);
  // Device kind -> the first job of that kind that waits for idle workers.
  std::map<std::string, const SchedJob*> blocked_by;
  SchedDecision decision;
  for (const SchedJob& job : queued) {
    const std::string kind = JobDeviceKind(job.device);
    int registered = 0;
    std::vector<size_t> idle;
    for (size_t i = 0; i < workers.size(); ++i) {
      if (WorkerDeviceKind(workers[i].device) != kind) continue;
      ++registered;
      if (workers[i].idle && !taken[i]) idle.push_back(i);
    }
    const int need = std::max(job.stages, 1) * std::max(job.replicas, 1);
    if (registered < need) {
      std::string needs =
          need == 1 ? absl::StrCat("a ", kind, " worker") : Plural(need, kind);
      if (job.replicas > 1) {
        absl::StrAppend(&needs, " (", job.stages, " stages x ", job.replicas,
                        " replicas)");
      }
      std::string have = registered == 0
                             ? "none registered"
                             : absl::StrCat(registered, " registered");
      decision.waiting[job.id] = absl::StrCat("needs ", needs, "; ", have);
      continue;
    }
    auto blocker = blocked_by.find(kind);
    if (blocker != blocked_by.end()) {
      decision.waiting[job.id] =
          absl::StrCat("waiting behind ", blocker->second->id, " (priority ",
                       blocker->second->priority, ") for ", kind, " workers");
      continue;
    }
    if (static_cast<int>(idle.size()) < need) {
      decision.waiting[job.id] =
          absl::StrCat("waiting for ", Plural(need, kind), "; ", idle.size(),
                       " of ", registered, " idle");
      blocked_by[kind] = &job;
      continue;
    }
    SchedDecision::Start start;
    start.job_id = job.id;
    for (int k = 0; k < need; ++k) {
      taken[idle[k]] = true;
      start.worker_ids.push_back(workers[idle[k]].id);
    }
    decision.starts.push_back(std::move(start));
  }
  return decision;
}

}  // namespace trainyard
