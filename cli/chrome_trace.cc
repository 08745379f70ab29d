#include "cli/chrome_trace.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace trainyard {
namespace {

using nlohmann::json;

struct KindInfo {
  ChromeTraceLane lane;
  const char* category;  // also the lane's name
  const char* prefix;    // event name: prefix + microbatch; else category
};

KindInfo InfoOf(v1::SpanKind kind) {
  switch (kind) {
    case v1::SPAN_DATA_WAIT:
      return {kLaneDataWait, "data wait", nullptr};
    case v1::SPAN_PREPARE_BATCH:
      return {kLanePrepare, "prepare batch", nullptr};
    case v1::SPAN_FORWARD:
      return {kLaneForward, "forward", "F"};
    case v1::SPAN_LOSS:
      return {kLaneLoss, "loss", "L"};
    case v1::SPAN_BACKWARD_INPUT:
      return {kLaneBackwardInput, "backward input", "B"};
    case v1::SPAN_BACKWARD_WEIGHT:
      return {kLaneBackwardWeight, "backward weight", "W"};
    case v1::SPAN_SEND_ACTIVATION:
      return {kLaneSend, "send", ">A"};
    case v1::SPAN_SEND_GRADIENT:
      return {kLaneSend, "send", ">G"};
    case v1::SPAN_RECV_ACTIVATION:
      return {kLaneRecvWait, "recv wait", "<A"};
    case v1::SPAN_RECV_GRADIENT:
      return {kLaneRecvWait, "recv wait", "<G"};
    case v1::SPAN_ALL_REDUCE:
      return {kLaneAllReduce, "all-reduce", nullptr};
    case v1::SPAN_OPTIMIZER:
      return {kLaneOptimizer, "optimizer", nullptr};
    case v1::SPAN_EVAL:
      return {kLaneEval, "eval", nullptr};
    default:
      return {kLaneStep, "unknown", nullptr};
  }
}

const char* LaneName(int lane) {
  switch (lane) {
    case kLaneStep:
      return "step";
    case kLanePrepare:
      return "prepare batch";
    case kLaneForward:
      return "forward";
    case kLaneLoss:
      return "loss";
    case kLaneBackwardInput:
      return "backward input";
    case kLaneBackwardWeight:
      return "backward weight";
    case kLaneSend:
      return "send";
    case kLaneRecvWait:
      return "recv wait (idle)";
    case kLaneAllReduce:
      return "all-reduce";
    case kLaneOptimizer:
      return "optimizer";
    case kLaneEval:
      return "eval";
    case kLaneDataWait:
      return "data wait";
    default:
      return "other";
  }
}

json Metadata(const char* name, int pid, int tid, json args) {
  json e = {{"name", name}, {"ph", "M"}, {"pid", pid}, {"args", args}};
  if (tid >= 0) e["tid"] = tid;
  return e;
}

}  // namespace

std::string SpanEventName(const v1::StageSpan& span) {
  const KindInfo info = InfoOf(span.kind());
  if (info.prefix == nullptr || span.microbatch() < 0) return info.category;
  return absl::StrCat(info.prefix, span.microbatch());
}

std::string ChromeTraceJson(const v1::GetTraceResponse& trace) {
  json events = json::array();
  for (const v1::StageTrace& st : trace.stages()) {
    const int pid = st.stage();
    std::string name = absl::StrCat("stage ", st.stage());
    if (!st.worker_id().empty()) {
      absl::StrAppend(&name, " (", st.worker_id(),
                      st.worker_name().empty() ? "" : " ", st.worker_name(),
                      ")");
    }
    events.push_back(Metadata("process_name", pid, -1, {{"name", name}}));
    events.push_back(
        Metadata("process_sort_index", pid, -1, {{"sort_index", pid}}));
    std::set<int> lanes = {kLaneStep};
    events.push_back({{"name", absl::StrCat("step ", trace.step())},
                      {"cat", "step"},
                      {"ph", "X"},
                      {"pid", pid},
                      {"tid", static_cast<int>(kLaneStep)},
                      {"ts", 0},
                      {"dur", st.step_us()},
                      {"args",
                       {{"step", trace.step()},
                        {"step_us", st.step_us()},
                        {"spans", st.spans_size()},
                        {"truncated", st.truncated()}}}});
    for (const v1::StageSpan& span : st.spans()) {
      const KindInfo info = InfoOf(span.kind());
      lanes.insert(info.lane);
      json args = {{"step", trace.step()}};
      if (span.microbatch() >= 0) args["microbatch"] = span.microbatch();
      events.push_back({{"name", SpanEventName(span)},
                        {"cat", info.category},
                        {"ph", "X"},
                        {"pid", pid},
                        {"tid", static_cast<int>(info.lane)},
                        {"ts", span.start_us()},
                        {"dur", span.end_us() - span.start_us()},
                        {"args", args}});
    }
    for (int lane : lanes) {
      events.push_back(
          Metadata("thread_name", pid, lane, {{"name", LaneName(lane)}}));
      events.push_back(
          Metadata("thread_sort_index", pid, lane, {{"sort_index", lane}}));
    }
  }
  json out = {
      {"traceEvents", events},
      {"displayTimeUnit", "ms"},
      {"otherData",
       {{"job_id", trace.job_id()},
        {"step", absl::StrCat(trace.step())},
        {"stages",
         absl::StrCat(trace.stages_size(), " of ", trace.num_stages())},
        {"clock",
         "each stage's events are timed from its own start of the step; "
         "stage clocks are not synchronised"}}}};
  return out.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

}  // namespace trainyard
