// Text the client commands print for jobs: JSON, metric lists, ETAs and log
// lines. Pure functions of their arguments (FormatLogLine reads the local
// time zone).
#ifndef TRAINYARD_CLI_JOB_FORMAT_H_
#define TRAINYARD_CLI_JOB_FORMAT_H_

#include <string>

#include "google/protobuf/map.h"
#include "google/protobuf/message.h"
#include "proto/trainyard.pb.h"

namespace trainyard {

// The message as indented proto3 JSON with the proto field names.
std::string ToJson(const google::protobuf::Message& m);

// The plugin's metrics, sorted, each as " <prefix><name>=<%.6g>" and each
// quantity once: a metric named "loss" that equals `loss` (already printed)
// is left out.
std::string FormatMetrics(const google::protobuf::Map<std::string, double>& m,
                          const std::string& prefix, double loss);

// "M:SS", or "H:MM:SS" from an hour; "--:--" when unknown (negative, NaN) or
// over 1e7 seconds.
std::string FormatEta(double seconds);

// A job's progress for `trainyard list`: "12/300" steps for a training job,
// "rows 640/1000" for an inference job, "eval" ("eval done" once its
// metrics are in) for an evaluation job.
std::string FormatProgress(const trainyard::v1::Job& job);

// One log line as `trainyard logs` prints it:
// "[stage 1 w-3 worker-1] 12:00:01.234 text", with "WARNING: " or "ERROR: "
// before the text by severity.
std::string FormatLogLine(const trainyard::v1::LogLine& l);

}  // namespace trainyard

#endif  // TRAINYARD_CLI_JOB_FORMAT_H_
