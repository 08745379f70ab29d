#include "worker/report_messages.h"

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace trainyard {
namespace {

using ::trainyard::v1::WorkerMessage;

void AddSpanProto(const Span& span, v1::StageTrace* out) {
  v1::StageSpan* s = out->add_spans();
  s->set_kind(span.kind);
  s->set_microbatch(span.microbatch);
  s->set_start_us(span.start_us);
  s->set_end_us(span.end_us);
}

}  // namespace

WorkerMessage StepMessage(const std::string& job_id, int stage,
                          const StepReport& r, double step_seconds) {
  WorkerMessage m;
  auto* report = m.mutable_step();
  report->set_job_id(job_id);
  report->set_stage(stage);
  auto* step = report->mutable_step();
  step->set_step(r.step);
  step->set_loss(r.loss);
  step->set_lr(r.lr);
  step->set_grad_norm(r.grad_norm);
  step->set_samples_per_sec(step_seconds > 0 ? r.samples / step_seconds : 0);
  for (const auto& [name, value] : r.metrics) {
    (*step->mutable_metrics())[name] = value;
  }
  auto* timing = step->add_stages();
  timing->set_stage(stage);
  timing->set_forward_s(r.times.forward);
  timing->set_backward_s(r.times.backward);
  timing->set_comm_s(r.times.comm);
  timing->set_idle_s(r.times.idle);
  timing->set_optimizer_s(r.times.optimizer);
  timing->set_loss_s(r.times.loss);
  timing->set_data_wait_s(r.times.data_wait);
  timing->set_h2d_copies(r.traffic.h2d_copies);
  timing->set_h2d_bytes(r.traffic.h2d_bytes);
  timing->set_d2h_copies(r.traffic.d2h_copies);
  timing->set_d2h_bytes(r.traffic.d2h_bytes);
  timing->set_syncs(r.traffic.syncs);
  v1::StageTrace* trace = report->mutable_trace();
  trace->set_stage(stage);
  trace->set_step_us(r.trace.step_us);
  trace->set_truncated(r.trace.truncated);
  for (const Span& span : r.trace.spans) AddSpanProto(span, trace);
  return m;
}

WorkerMessage EvalMessage(const std::string& job_id, int stage, int64_t step,
                          const EvalReport& r) {
  WorkerMessage m;
  auto* report = m.mutable_eval();
  report->set_job_id(job_id);
  report->set_stage(stage);
  auto* eval = report->mutable_eval();
  eval->set_step(step);
  eval->set_loss(r.loss);
  eval->set_samples(r.samples);
  for (const auto& [name, value] : r.metrics) {
    (*eval->mutable_metrics())[name] = value;
  }
  if (r.span.has_value()) {
    report->mutable_trace()->set_stage(stage);
    AddSpanProto(*r.span, report->mutable_trace());
  }
  return m;
}

WorkerMessage DoneMessage(const std::string& job_id, int stage,
                          const absl::Status& status, const std::string& error,
                          bool cancelled) {
  WorkerMessage m;
  auto* done = m.mutable_done();
  done->set_job_id(job_id);
  done->set_stage(stage);
  done->set_ok(status.ok());
  done->set_error(error);
  done->set_cancelled(cancelled);
  done->set_code(static_cast<int32_t>(status.code()));
  return m;
}

WorkerMessage StartedMessage(const std::string& job_id, int stage,
                             int64_t resume_step) {
  WorkerMessage m;
  auto* started = m.mutable_started();
  started->set_job_id(job_id);
  started->set_stage(stage);
  started->set_resume_step(resume_step);
  return m;
}

WorkerMessage TransportMessage(const std::string& job_id, int stage,
                               const TransportChoice& choice) {
  WorkerMessage m;
  auto* t = m.mutable_transport();
  t->set_job_id(job_id);
  t->set_stage(stage);
  t->set_kind(TransportKindName(choice.kind));
  t->set_reason(choice.reason);
  return m;
}

WorkerMessage RendezvousMessage(const std::string& job_id,
                                const RemoteRendezvous::Request& request) {
  WorkerMessage m;
  if (request.kind == RemoteRendezvous::Request::Kind::kPut) {
    auto* put = m.mutable_rendezvous_put();
    put->set_request_id(request.id);
    put->set_job_id(job_id);
    put->set_key(request.key);
    put->set_value(request.value);
  } else {
    auto* get = m.mutable_rendezvous_get();
    get->set_request_id(request.id);
    get->set_job_id(job_id);
    get->set_key(request.key);
    get->set_timeout_ms(absl::ToInt64Milliseconds(request.timeout));
  }
  return m;
}

WorkerMessage HeldMessage(const std::string& job_id, int stage, int64_t step) {
  WorkerMessage m;
  m.mutable_held()->set_job_id(job_id);
  m.mutable_held()->set_stage(stage);
  m.mutable_held()->set_step(step);
  return m;
}

WorkerMessage ShardMessage(const std::string& job_id, int stage, int64_t shard,
                           const OutputProgress& p) {
  WorkerMessage m;
  auto* r = m.mutable_shard();
  r->set_job_id(job_id);
  r->set_stage(stage);
  r->set_shard(shard);
  r->set_rows_done(p.rows_done);
  r->set_shards_done(p.shards_done);
  r->set_rows_total(p.rows_total);
  r->set_shards_total(p.shards_total);
  return m;
}

WorkerMessage HeartbeatMessage(bool draining) {
  WorkerMessage beat;
  beat.mutable_heartbeat()->set_time_ms(absl::ToUnixMillis(absl::Now()));
  if (draining) beat.mutable_heartbeat()->set_draining(true);
  return beat;
}

}  // namespace trainyard
