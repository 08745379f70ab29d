// Stage: a training step and an eval pass from start to end, and the
// optimizer step that ends a training step.
#include <algorithm>
#include <optional>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "engine/lr_schedule.h"
#include "engine/stage.h"
#include "kernels/device_ops.h"

namespace trainyard {

absl::StatusOr<StepReport> Stage::RunStep() {
  RETURN_IF_ERROR(CheckTrains("RunStep"));
  const DeviceTraffic traffic_before = ctx_->traffic();
  RETURN_IF_ERROR(tracer_->BeginStep());
  absl::Cleanup timing_off = [this] { tracer_->StopTiming(); };
  const int64_t step = completed_steps_;  // 0-based
  const int M = plan_.spec.parallelism().microbatches();
  const int mine = M / replicas_;  // this replica's microbatches
  first_microbatch_ = replica_ * mine;
  StepReport report;
  report.step = step + 1;
  report.samples = plan_.spec.data().batch_size();
  ResetMicrobatches(mine);
  grads_written_.assign(blocks_.size(), false);
  if (loss_) loss_->Reset();
  if (scalars_.has_value()) RETURN_IF_ERROR(scalars_->Begin(mine));
  if (task_ != nullptr) {
    RETURN_IF_ERROR(task_->OnEvent(TRAINYARD_EVENT_STEP_BEGIN, step, ""));
  }
  // Each microbatch's forward and input gradient read every weight.
  BeginPasses(2 * mine);
  absl::Cleanup end_passes = [this] { EndPasses(); };
  if (is_first()) {
    const int64_t position = sampler_->position();
    RETURN_IF_ERROR(PrepareBatch(*data_.train, sampler_->Next(), position, step,
                                 /*is_eval=*/false, M, first_microbatch_,
                                 mine));
  }
  chained_weight_passes_.clear();
  RETURN_IF_ERROR(RunSchedule(train_schedule_, step, false, M));
  RETURN_IF_ERROR(RunChainedWeightPasses());
  // The optimizer changes the weights the packs were made from.
  std::move(end_passes).Invoke();
  RETURN_IF_ERROR(FinishGradients());
  if (replicas_ > 1) {
    SpanTimer t(tracer_.get(), &StageTimes::comm, v1::SPAN_ALL_REDUCE, -1,
                /*traced=*/false);
    RETURN_IF_ERROR(SumReplicaGradients());
  }
  RETURN_IF_ERROR(OptimizerStep(step, &report));
  if (is_last()) {
    ASSIGN_OR_RETURN(report.metrics, task_->UpdateMetrics(false));
  }
  if (task_ != nullptr) {
    RETURN_IF_ERROR(task_->OnEvent(TRAINYARD_EVENT_STEP_END, step, ""));
  }
  microbatches_.clear();
  ++completed_steps_;
  RETURN_IF_ERROR(tracer_->EndStep(scalars_.has_value(), &report));
  report.traffic = ctx_->traffic() - traffic_before;
  return report;
}

void Stage::BeginPasses(int weight_reads) {
  for (auto& block : blocks_) block->BeginPasses(weight_reads);
}

void Stage::EndPasses() {
  for (auto& block : blocks_) block->EndPasses();
}

absl::Status Stage::FinishGradients() {
  for (Chunk& chunk : chunks_) {
    for (int b = chunk.local_begin; b < chunk.local_end; ++b) {
      if (!grads_written_[b]) {
        return absl::InternalError(absl::StrCat(
            Where(), ": block ", chunk.first_block + b - chunk.local_begin,
            " got no weight gradient"));
      }
    }
    // The tree's last fold (a few adds and one copy) is in the step's time
    // but in no phase or span: the spans stay the schedule's actions.
    if (chunk.tree.has_value()) {
      Tensor grads = store_->grads().Rows(chunk.grad_offset,
                                          chunk.grad_offset + chunk.grad_size);
      RETURN_IF_ERROR(chunk.tree->Finish(&grads));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<EvalReport> Stage::RunEval() {
  const StepTracer::Clock::time_point start = StepTracer::Clock::now();
  EvalReport report;
  const int64_t rows = data_.eval_rows;
  if (loss_) loss_->Reset();
  // Every replica evaluates the whole eval set (the same bits on each).
  first_microbatch_ = 0;
  // Eval batches are numbered in the message's step field so that a stray
  // training message can never be mistaken for one.
  RETURN_IF_ERROR(ForwardBatches(0, rows, 0));
  report.samples = rows;
  if (is_last() && rows > 0) {
    report.loss =
        loss_->weight_sum() > 0 ? loss_->loss_sum() / loss_->weight_sum() : 0.0;
    ASSIGN_OR_RETURN(report.metrics, task_->UpdateMetrics(true));
  }
  report.span = tracer_->EvalSpan(start);
  return report;
}

absl::Status Stage::ForwardBatches(int64_t begin, int64_t end,
                                   int64_t first_tag) {
  const int64_t batch = plan_.spec.data().batch_size();
  const int M = plan_.spec.parallelism().microbatches();
  const bool loss_slots =
      infer_sink_ == nullptr && loss_.has_value() && loss_->on_device();
  // Every microbatch of every batch of the run reads the same weights.
  int64_t microbatches = 0;
  for (int64_t b = begin; b < end; b += batch) {
    microbatches += std::min<int64_t>(M, std::min(batch, end - b));
  }
  BeginPasses(static_cast<int>(std::min<int64_t>(microbatches, 1 << 20)));
  absl::Cleanup end_passes = [this] { EndPasses(); };
  int64_t tag = first_tag;
  for (int64_t b = begin; b < end; b += batch, ++tag) {
    if (infer_cancel_ != nullptr && infer_cancel_->load()) {
      return absl::CancelledError(
          absl::StrCat(Where(), " cancelled at data row ", b));
    }
    const int64_t n = std::min(batch, end - b);
    const int parts = static_cast<int>(std::min<int64_t>(M, n));
    ResetMicrobatches(parts);
    microbatch_rows_.clear();
    for (const auto& range : MicrobatchRanges(n, parts)) {
      microbatch_rows_.push_back(b + range.first);
    }
    if (scalars_.has_value()) RETURN_IF_ERROR(scalars_->Begin(parts));
    if (is_first()) {
      std::vector<int64_t> idx(n);
      for (int64_t i = 0; i < n; ++i) idx[i] = b + i;
      RETURN_IF_ERROR(PrepareBatch(*data_.eval, idx, /*position=*/-1,
                                   completed_steps_, true, parts, 0, parts));
    }
    RETURN_IF_ERROR(RunSchedule(
        MakeForwardOnlySchedule(num_stages_, parts, plan_.num_chunks,
                                plan_.chunk_layout),
        tag, true, parts));
    if (loss_slots) {
      // One read per eval batch: its loss slots.
      RETURN_IF_ERROR(scalars_->Read());
      RETURN_IF_ERROR(
          loss_->Finish(completed_steps_, 0, parts, parts, /*is_eval=*/true));
    } else if (device_data_.has_value()) {
      // The next batch reuses the pinned row indices.
      RETURN_IF_ERROR(ctx_->Synchronize());
    }
  }
  microbatches_.clear();
  return absl::OkStatus();
}

absl::Status Stage::SumReplicaGradients() {
  Tensor& grads = store_->grads();
  if (options_.device_replicas != nullptr) {
    return Prefixed(options_.device_replicas->SumInTreeOrder(
                        replica_, *ctx_, &grads, options_.timeout),
                    absl::StrCat(Where(), ": "));
  }
  if (grads.device().is_cpu()) {
    return Prefixed(replica_group_->SumInTreeOrder(&grads),
                    absl::StrCat(Where(), ": "));
  }
  // Gloo works on host memory: through a host copy.
  ASSIGN_OR_RETURN(Tensor host, ctx_->HostCopy(grads));
  RETURN_IF_ERROR(Prefixed(replica_group_->SumInTreeOrder(&host),
                           absl::StrCat(Where(), ": ")));
  return ctx_->CopyInto(host, &grads);
}

absl::Status Stage::OptimizerStep(int64_t step, StepReport* report) {
  if (scalars_.has_value()) return DeviceOptimizerStep(step, report);
  StepContributions mine;
  {
    SpanTimer t(tracer_.get(), &StageTimes::optimizer, v1::SPAN_OPTIMIZER);
    ASSIGN_OR_RETURN(mine.sums_of_squares,
                     optimizer_->GradSumsOfSquares(store_->grads()));
  }
  return ReduceAndUpdate(step, std::move(mine), report);
}

absl::Status Stage::ReduceAndUpdate(int64_t step, StepContributions mine,
                                    StepReport* report) {
  for (size_t i = 0; i < store_->segments().size(); ++i) {
    mine.params.push_back(store_->global_index(static_cast<int>(i)));
  }
  mine.is_last = is_last();
  mine.checkpoint_file_written = checkpoint_file_written_;
  if (is_last()) {
    mine.weight_sum = loss_->weight_sum();
    mine.loss_sum = loss_->loss_sum();
    if (replicas_ > 1) {
      // Every microbatch's (w, w L) from every replica, in microbatch
      // order, summed one after another: R = 1's sums, bit for bit.
      ASSIGN_OR_RETURN(std::vector<double> all,
                       replica_group_->AllGather(loss_->terms()));
      mine.weight_sum = 0;
      mine.loss_sum = 0;
      for (size_t i = 0; i + 1 < all.size(); i += 2) {
        mine.weight_sum += all[i];
        mine.loss_sum += all[i + 1];
      }
    }
  }
  std::optional<StepTotals> totals;
  {
    // ReduceStep adds the all-reduce's own time to times.comm; the span is
    // the whole call (packing, the all-reduce, the totals).
    SpanTimer t(tracer_.get(), nullptr, v1::SPAN_ALL_REDUCE);
    ASSIGN_OR_RETURN(
        totals,
        ReduceStep(plan_, mine, num_stages_ > 1 ? transport_ : nullptr,
                   options_.timeout, step, Where(), &report->times.comm));
  }
  SpanTimer t(tracer_.get(), &StageTimes::optimizer, v1::SPAN_OPTIMIZER);
  report->loss = totals->loss;
  report->grad_norm = totals->grad_norm;
  report->checkpoint_files_written = totals->checkpoint_files_written;
  report->lr = LearningRate(plan_.spec.optimizer(), step);
  return optimizer_->Step(&store_->params(), store_->grads(), report->lr,
                          totals->grad_scale, &store_->params_bf16());
}

absl::Status Stage::DeviceOptimizerStep(int64_t step, StepReport* report) {
  report->lr = LearningRate(plan_.spec.optimizer(), step);
  if (device_totals_) return DeviceTotalsStep(step, report);
  // The pipeline's all-reduce needs every stage's numbers on the host: the
  // step's one read comes first.
  StepContributions contributions;
  {
    SpanTimer t(tracer_.get(), &StageTimes::optimizer, v1::SPAN_OPTIMIZER);
    RETURN_IF_ERROR(optimizer_->GradSumsOfSquaresOnDevice(
        store_->grads(), scalars_->sums_of_squares()));
  }
  RETURN_IF_ERROR(ReadScalars());
  if (loss_.has_value() && loss_->on_device()) {
    RETURN_IF_ERROR(loss_->Finish(step, first_microbatch_, per_chunk_,
                                  plan_.spec.parallelism().microbatches(),
                                  /*is_eval=*/false));
  }
  const double* sums = scalars_->host_sums_of_squares();
  contributions.sums_of_squares.assign(sums, sums + scalars_->num_params());
  return ReduceAndUpdate(step, std::move(contributions), report);
}

absl::Status Stage::DeviceTotalsStep(int64_t step, StepReport* report) {
  const double clip = plan_.spec.optimizer().clip_grad();
  // Everything on the device, then the step's one read.
  {
    SpanTimer t(tracer_.get(), &StageTimes::optimizer, v1::SPAN_OPTIMIZER);
    RETURN_IF_ERROR(optimizer_->GradSumsOfSquaresOnDevice(
        store_->grads(), scalars_->sums_of_squares()));
    RETURN_IF_ERROR(DeviceTotals(*ctx_, scalars_->TotalsArgs(clip)));
    RETURN_IF_ERROR(optimizer_->StepWithDeviceTotals(
        &store_->params(), store_->grads(), report->lr, scalars_->totals(),
        &store_->params_bf16()));
  }
  RETURN_IF_ERROR(ReadScalars());
  // The host learns the step's outcome, and why a refused step was refused
  // (the device left the parameters as they were). per_chunk_ is this
  // replica's microbatches.
  RETURN_IF_ERROR(loss_->Finish(step, first_microbatch_, per_chunk_,
                                plan_.spec.parallelism().microbatches(),
                                /*is_eval=*/false));
  const StepTotalsValues v = ComputeStepTotals(
      scalars_->host_sums_of_squares(), scalars_->num_params(),
      loss_->weight_sum(), loss_->loss_sum(), clip);
  RETURN_IF_ERROR(TotalsError(plan_, v, loss_->weight_sum(), step));
  const double* device = scalars_->host_totals();
  if (device[kTotalsSkipWord] != 0 || device[0] != v.loss ||
      device[1] != v.grad_norm || device[kTotalsScaleWord] != v.grad_scale) {
    return absl::InternalError(absl::StrCat(
        Where(), ": step ", step + 1, ": the device's totals (loss ", device[0],
        ", norm ", device[1], ", scale ", device[2], ", skip ", device[3],
        ") are not the host's (", v.loss, ", ", v.grad_norm, ", ", v.grad_scale,
        ")"));
  }
  report->loss = v.loss;
  report->grad_norm = v.grad_norm;
  report->checkpoint_files_written = checkpoint_file_written_ ? 1 : 0;
  return absl::OkStatus();
}

absl::Status Stage::ReadScalars() {
  tracer_->MarkRead();
  return scalars_->Read();
}

}  // namespace trainyard
