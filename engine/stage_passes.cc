// Stage: a batch's rows into microbatches of model inputs, and the passes
// of one microbatch through a chunk's blocks (forward, backward-input,
// backward-weight).
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "engine/stage.h"
#include "kernels/device_ops.h"

namespace trainyard {

std::vector<std::pair<int64_t, int64_t>> MicrobatchRanges(int64_t rows,
                                                          int parts) {
  std::vector<std::pair<int64_t, int64_t>> out;
  const int64_t base = rows / parts, extra = rows % parts;
  int64_t begin = 0;
  for (int i = 0; i < parts; ++i) {
    const int64_t n = base + (i < extra ? 1 : 0);
    out.push_back({begin, begin + n});
    begin += n;
  }
  return out;
}

absl::Status Stage::PrepareBatch(const Dataset& data, std::vector<int64_t> rows,
                                 int64_t position, int64_t step, bool is_eval,
                                 int num_microbatches, int first, int count) {
  // The whole batch's split into microbatches; this replica takes `count`
  // of them from `first`, so every microbatch holds the same rows whatever
  // the number of replicas.
  const auto ranges =
      MicrobatchRanges(static_cast<int64_t>(rows.size()), num_microbatches);
  const int64_t begin = ranges[first].first;
  const int64_t end = ranges[first + count - 1].second;
  rows = std::vector<int64_t>(rows.begin() + begin, rows.begin() + end);
  ForwardInputs in;
  if (device_data_.has_value()) {
    SpanTimer t(tracer_.get(), nullptr, v1::SPAN_PREPARE_BATCH);
    ASSIGN_OR_RETURN(in, GatherOnDevice(rows, is_eval));
  } else {
    const bool from_reader = position >= 0 && reader_ != nullptr;
    ASSIGN_OR_RETURN(const BatchReader::Batch raw,
                     ReadRows(data, rows, position));
    SpanTimer t(tracer_.get(), nullptr, v1::SPAN_PREPARE_BATCH);
    ASSIGN_OR_RETURN(in, from_reader && InputsPassThroughOnDevice()
                             ? InputsOnDevice(raw)
                             : BuildOnHost(raw, step, is_eval));
  }
  for (int m = 0; m < count; ++m) {
    Microbatch& mb = MicrobatchAt(0, m);
    const int64_t lo = ranges[first + m].first - begin;
    const int64_t hi = ranges[first + m].second - begin;
    mb.input = in.inputs.Rows(lo, hi);
    mb.state.clear();
    for (auto& [name, t] : in.state) {
      mb.state.push_back({name, t.Rows(lo, hi)});
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ForwardInputs> Stage::GatherOnDevice(
    const std::vector<int64_t>& rows, bool is_eval) {
  // The rows are gathered on the device from the resident data set; only
  // their indices cross (asynchronously, from pinned memory, which the
  // step's synchronisation frees for the next batch).
  const Tensor& features =
      is_eval ? device_data_->eval_features : device_data_->train_features;
  const Tensor& targets =
      is_eval ? device_data_->eval_targets : device_data_->train_targets;
  const int64_t n = static_cast<int64_t>(rows.size());
  Tensor host_rows = device_data_->rows_host.Rows(0, n);
  Tensor dev_rows = device_data_->rows.Rows(0, n);
  if (n > 0) {
    std::memcpy(host_rows.raw_data(), rows.data(), n * sizeof(int64_t));
  }
  RETURN_IF_ERROR(ctx_->CopyToDeviceAsync(host_rows, &dev_rows));
  ForwardInputs in;
  ASSIGN_OR_RETURN(in.inputs,
                   ctx_->Empty(ctx_->activation_dtype(), {n, features.dim(1)}));
  RETURN_IF_ERROR(GatherRows(*ctx_, features, dev_rows, &in.inputs));
  Shape target_shape = targets.shape();
  target_shape[0] = n;
  ASSIGN_OR_RETURN(Tensor gathered, ctx_->Empty(targets.dtype(), target_shape));
  RETURN_IF_ERROR(GatherRows(*ctx_, targets, dev_rows, &gathered));
  in.state.push_back({"targets", gathered});
  return in;
}

absl::StatusOr<BatchReader::Batch> Stage::ReadRows(
    const Dataset& data, const std::vector<int64_t>& rows, int64_t position) {
  SpanTimer t(tracer_.get(), &StageTimes::data_wait, v1::SPAN_DATA_WAIT);
  if (position >= 0 && reader_ != nullptr) {
    return reader_->Take(position);
  }
  ASSIGN_OR_RETURN(Dataset batch, Gather(data, rows));
  return BatchReader::Batch{batch.features, batch.targets};
}

absl::StatusOr<ForwardInputs> Stage::InputsOnDevice(
    const BatchReader::Batch& raw) {
  // Both copies are queued from the reader's pinned buffers, which stay
  // untouched until the next batch is taken, after this step's
  // synchronisation.
  ForwardInputs in;
  ASSIGN_OR_RETURN(Tensor stored,
                   ctx_->Empty(raw.features.dtype(), raw.features.shape()));
  RETURN_IF_ERROR(ctx_->CopyToDeviceAsync(raw.features, &stored));
  ASSIGN_OR_RETURN(in.inputs, ctx_->Cast(stored, ctx_->activation_dtype()));
  ASSIGN_OR_RETURN(Tensor targets,
                   ctx_->Empty(raw.targets.dtype(), raw.targets.shape()));
  RETURN_IF_ERROR(ctx_->CopyToDeviceAsync(raw.targets, &targets));
  in.state.push_back({"targets", targets});
  return in;
}

absl::StatusOr<ForwardInputs> Stage::BuildOnHost(const BatchReader::Batch& raw,
                                                 int64_t step, bool is_eval) {
  NamedTensors named = {{"features", raw.features}, {"targets", raw.targets}};
  ASSIGN_OR_RETURN(ForwardInputs in,
                   task_->BuildForwardInputs(named, step, is_eval));
  if (in.inputs.ndim() != 2 || in.inputs.dim(1) != plan_.feature_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("task plugin \"", plan_.spec.task().plugin(),
                     "\": build_forward_inputs returned inputs ",
                     ShapeToString(in.inputs.shape()), ", block 0 takes [B, ",
                     plan_.feature_dim, "]"));
  }
  // One copy of the whole batch to the device; microbatches are views.
  ASSIGN_OR_RETURN(in.inputs, ctx_->ToDevice(in.inputs));
  ASSIGN_OR_RETURN(in.inputs, ctx_->Cast(in.inputs, ctx_->activation_dtype()));
  // A device loss takes its state on the device: one copy each.
  if (scalars_.has_value() && PluginLossOnDevice()) {
    for (auto& [name, t] : in.state) {
      ASSIGN_OR_RETURN(t, ctx_->ToDevice(t));
    }
  }
  return in;
}

absl::Status Stage::Forward(Microbatch* mb, bool save_for_backward) {
  const Chunk& chunk = chunks_[mb->chunk];
  mb->saved.clear();
  mb->saved.resize(chunk.local_end - chunk.local_begin);
  Tensor x = mb->input;
  for (int b = chunk.local_begin; b < chunk.local_end; ++b) {
    const int i = b - chunk.local_begin;
    Tensor y;
    absl::Status st =
        blocks_[b]->Forward(store_->block_params(b), x, &y,
                            save_for_backward ? &mb->saved[i] : nullptr);
    if (!st.ok()) {
      return Prefixed(st, absl::StrCat(Where(), " block ",
                                       chunk.first_block + i, " forward: "));
    }
    x = y;
  }
  mb->output = x;
  if (!save_for_backward) mb->saved.clear();
  return absl::OkStatus();
}

absl::Status Stage::BackwardInput(Microbatch* mb) {
  const Chunk& chunk = chunks_[mb->chunk];
  Tensor d = mb->grad_output;
  for (int b = chunk.local_end - 1; b >= chunk.local_begin; --b) {
    const int i = b - chunk.local_begin;
    Tensor dx;
    // The model's input needs no gradient.
    const bool need_dx = !(i == 0 && chunk.virtual_stage == 0);
    absl::Status st =
        blocks_[b]->BackwardInput(store_->block_params(b), d,
                                  mb->saved[i].get(), need_dx ? &dx : nullptr);
    if (!st.ok()) {
      return Prefixed(st, absl::StrCat(Where(), " block ",
                                       chunk.first_block + i, " backward: "));
    }
    d = dx;
  }
  mb->grad_input = d;
  mb->grad_output = Tensor();
  return absl::OkStatus();
}

absl::Status Stage::BackwardWeight(Microbatch* mb) {
  // With the tree, each microbatch's gradient is written alone, into the
  // tree's free leaf when it starts a pair, else into the stage's gradient
  // buffer and then added to the tree; without it, the GEMMs accumulate
  // into the buffer directly.
  Chunk& chunk = chunks_[mb->chunk];
  const bool tree = chunk.tree.has_value();
  const auto sum_error = [&](const absl::Status& st) {
    return Prefixed(st, absl::StrCat(Where(), " microbatch ", mb->index,
                                     " gradient sum: "));
  };
  Tensor leaf;
  if (tree) {
    absl::StatusOr<Tensor> free_leaf = chunk.tree->Leaf();
    if (!free_leaf.ok()) return sum_error(free_leaf.status());
    leaf = *std::move(free_leaf);
  }
  for (int b = chunk.local_begin; b < chunk.local_end; ++b) {
    const int i = b - chunk.local_begin;
    MlpBlockParams in_leaf;
    if (leaf.defined()) {
      in_leaf = store_->BlockViewsOf(b, leaf, chunk.grad_offset);
    }
    absl::Status st = blocks_[b]->BackwardWeight(
        mb->saved[i].get(), !tree && grads_written_[b],
        leaf.defined() ? &in_leaf : &store_->block_grads(b));
    if (!st.ok()) {
      return Prefixed(st,
                      absl::StrCat(Where(), " block ", chunk.first_block + i,
                                   " weight gradient: "));
    }
    grads_written_[b] = true;
  }
  if (leaf.defined()) {
    chunk.tree->AddLeaf();
  } else if (tree) {
    absl::Status st = chunk.tree->Add(store_->grads().Rows(
        chunk.grad_offset, chunk.grad_offset + chunk.grad_size));
    if (!st.ok()) return sum_error(st);
  }
  mb->ReleaseSaved();
  return absl::OkStatus();
}

absl::Status Stage::RunChainedWeightPasses() {
  if (chained_weight_passes_.empty()) return absl::OkStatus();
  SpanTimer t(tracer_.get(), &StageTimes::backward, v1::SPAN_BACKWARD_WEIGHT);
  // One chunk (ChainsWeightPasses), no tree: the blocks' gradients start
  // from the first microbatch's.
  const Chunk& chunk = chunks_[0];
  std::vector<BlockSaved*> saved(chained_weight_passes_.size());
  for (int b = chunk.local_begin; b < chunk.local_end; ++b) {
    const int i = b - chunk.local_begin;
    for (size_t m = 0; m < saved.size(); ++m) {
      saved[m] = chained_weight_passes_[m]->saved[i].get();
    }
    absl::Status st = blocks_[b]->BackwardWeights(saved, grads_written_[b],
                                                  &store_->block_grads(b));
    if (!st.ok()) {
      return Prefixed(st,
                      absl::StrCat(Where(), " block ", chunk.first_block + i,
                                   " weight gradients: "));
    }
    grads_written_[b] = true;
  }
  for (Microbatch* mb : chained_weight_passes_) mb->ReleaseSaved();
  chained_weight_passes_.clear();
  return absl::OkStatus();
}

}  // namespace trainyard
