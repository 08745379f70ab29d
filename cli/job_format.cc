#include "cli/job_format.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "google/protobuf/util/json_util.h"

namespace trainyard {

std::string ToJson(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions opts;
  opts.add_whitespace = true;
  opts.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, opts);
  return out;
}

std::string FormatMetrics(const google::protobuf::Map<std::string, double>& m,
                          const std::string& prefix, double loss) {
  std::vector<std::string> keys;
  for (const auto& [k, v] : m) {
    if (k == "loss" && v == loss) continue;
    keys.push_back(k);
  }
  std::sort(keys.begin(), keys.end());
  std::string out;
  for (const auto& k : keys) {
    absl::StrAppend(&out, " ", prefix, k, "=",
                    absl::StrFormat("%.6g", m.at(k)));
  }
  return out;
}

std::string FormatProgress(const trainyard::v1::Job& job) {
  const std::string& kind = job.spec().kind();
  if (kind == "infer") {
    return absl::StrCat("rows ", job.progress().rows_done(), "/",
                        job.progress().rows_total());
  }
  if (kind == "eval") return job.has_last_eval() ? "eval done" : "eval";
  return absl::StrCat(job.steps_completed(), "/", job.spec().steps());
}

std::string FormatEta(double seconds) {
  if (!(seconds >= 0) || seconds > 1e7) return "--:--";
  int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) {
    return absl::StrFormat("%d:%02d:%02d", s / 3600, (s / 60) % 60, s % 60);
  }
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

std::string FormatLogLine(const trainyard::v1::LogLine& l) {
  const char* severity = "";
  if (l.severity() == trainyard::v1::LOG_SEVERITY_WARNING) {
    severity = "WARNING: ";
  } else if (l.severity() == trainyard::v1::LOG_SEVERITY_ERROR) {
    severity = "ERROR: ";
  }
  return absl::StrCat(
      "[stage ", l.stage(), " ", l.worker_id(), " ", l.worker_name(), "] ",
      absl::FormatTime("%H:%M:%E3S", absl::FromUnixMillis(l.time_ms()),
                       absl::LocalTimeZone()),
      " ", severity, l.text());
}

}  // namespace trainyard
