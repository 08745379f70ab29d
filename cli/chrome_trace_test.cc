#include "cli/chrome_trace.h"

#include <map>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace trainyard {
namespace {

using nlohmann::json;

void AddSpan(v1::StageTrace* t, v1::SpanKind kind, int mb, int64_t start,
             int64_t end) {
  v1::StageSpan* s = t->add_spans();
  s->set_kind(kind);
  s->set_microbatch(mb);
  s->set_start_us(start);
  s->set_end_us(end);
}

v1::GetTraceResponse TwoStages() {
  v1::GetTraceResponse r;
  r.set_job_id("job-3");
  r.set_step(7);
  r.set_num_stages(2);
  v1::StageTrace* s0 = r.add_stages();
  s0->set_stage(0);
  s0->set_worker_id("w-1");
  s0->set_worker_name("pod \"a\"");
  s0->set_step_us(1000);
  AddSpan(s0, v1::SPAN_FORWARD, 0, 10, 110);
  AddSpan(s0, v1::SPAN_SEND_ACTIVATION, 0, 110, 120);
  AddSpan(s0, v1::SPAN_RECV_GRADIENT, 0, 120, 500);
  AddSpan(s0, v1::SPAN_BACKWARD_INPUT, 0, 500, 600);
  AddSpan(s0, v1::SPAN_ALL_REDUCE, -1, 700, 800);
  v1::StageTrace* s1 = r.add_stages();
  s1->set_stage(1);
  s1->set_step_us(900);
  AddSpan(s1, v1::SPAN_FORWARD, 0, 0, 50);
  AddSpan(s1, v1::SPAN_LOSS, 0, 50, 60);
  return r;
}

TEST(ChromeTraceTest, EverySpanIsACompleteEventOfItsStageAndLane) {
  json doc = json::parse(ChromeTraceJson(TwoStages()));
  ASSERT_TRUE(doc["traceEvents"].is_array());
  std::map<std::string, json> by_name;  // "pid/name" -> event
  std::map<int, std::string> process_names;
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") {
      process_names[e["pid"]] = e["args"]["name"];
    }
    if (e["ph"] != "X") continue;
    by_name[std::to_string(e["pid"].get<int>()) + "/" +
            e["name"].get<std::string>()] = e;
  }
  EXPECT_EQ(process_names[0], "stage 0 (w-1 pod \"a\")");
  EXPECT_EQ(process_names[1], "stage 1");
  const json& f0 = by_name.at("0/F0");
  EXPECT_EQ(f0["ts"], 10);
  EXPECT_EQ(f0["dur"], 100);
  EXPECT_EQ(f0["tid"], kLaneForward);
  EXPECT_EQ(f0["args"]["microbatch"], 0);
  EXPECT_EQ(f0["cat"], "forward");
  EXPECT_EQ(by_name.at("0/>A0")["tid"], kLaneSend);
  EXPECT_EQ(by_name.at("0/<G0")["tid"], kLaneRecvWait);
  EXPECT_EQ(by_name.at("0/B0")["tid"], kLaneBackwardInput);
  EXPECT_FALSE(by_name.at("0/all-reduce")["args"].contains("microbatch"));
  EXPECT_EQ(by_name.at("1/L0")["tid"], kLaneLoss);
  EXPECT_EQ(by_name.at("0/step 7")["dur"], 1000);
  EXPECT_EQ(by_name.at("1/step 7")["dur"], 900);
  EXPECT_EQ(doc["otherData"]["job_id"], "job-3");
}

TEST(ChromeTraceTest, LanesAreNamed) {
  json doc = json::parse(ChromeTraceJson(TwoStages()));
  std::map<std::pair<int, int>, std::string> lanes;
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") {
      lanes[{e["pid"], e["tid"]}] = e["args"]["name"];
    }
  }
  EXPECT_EQ((lanes[{0, kLaneRecvWait}]), "recv wait (idle)");
  EXPECT_EQ((lanes[{1, kLaneLoss}]), "loss");
  EXPECT_EQ(lanes.count({1, kLaneSend}), 0u);  // no span there
}

}  // namespace
}  // namespace trainyard
