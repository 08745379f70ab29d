// Job specs as proto3 JSON: ParseJobSpecJson, LoadJobSpecFile, SpecToJson
// and TaskConfigJson (job_plan.h).
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "google/protobuf/util/json_util.h"
#include "plan/job_plan.h"

namespace trainyard {

using trainyard::v1::JobSpec;

absl::StatusOr<JobSpec> ParseJobSpecJson(const std::string& json_text,
                                         const std::string& source_name) {
  JobSpec spec;
  google::protobuf::util::JsonParseOptions opts;
  opts.ignore_unknown_fields = false;
  google::protobuf::util::Status s =
      google::protobuf::util::JsonStringToMessage(json_text, &spec, opts);
  if (!s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_name, ": invalid job spec JSON: ",
                     std::string(s.message().data(), s.message().size())));
  }
  return spec;
}

absl::StatusOr<JobSpec> LoadJobSpecFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) return text.status();
  return ParseJobSpecJson(*text, path);
}

std::string SpecToJson(const JobSpec& spec) {
  std::string json;
  google::protobuf::util::JsonPrintOptions opts;
  opts.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(spec, &json, opts).ok()) {
    return "null";
  }
  return json;
}

absl::StatusOr<std::string> TaskConfigJson(const JobSpec& spec) {
  if (!spec.task().has_config()) return std::string("{}");
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(spec.task().config(), &json)
           .ok()) {
    return absl::InvalidArgumentError("task.config: not valid JSON");
  }
  return json;
}

}  // namespace trainyard
