#include "engine/stage_runner.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/npy.h"
#include "core/safetensors.h"
#include "core/status_macros.h"
#include "engine/checkpoint_store.h"
#include "engine/checkpoint_writer.h"
#include "engine/dataset.h"
#include "glog/logging.h"

namespace trainyard {
namespace {

// Evals: every `every` steps and after the last; never when every is 0.
bool Due(int64_t step, int64_t every, int64_t last_step) {
  return every > 0 && (step % every == 0 || step == last_step);
}

// Checkpoints (when a dir is set): every `every` steps and after the last
// step; only after the last step when every is 0.
bool CheckpointDue(int64_t step, int64_t every, int64_t last_step) {
  return step == last_step || (every > 0 && step % every == 0);
}

}  // namespace

absl::StatusOr<int64_t> EvalRows(const JobPlan& plan) {
  const auto& data = plan.spec.data();
  if (data.has_eval()) {
    if (data.eval().has_synthetic())
      return data.eval().synthetic().num_samples();
    if (data.eval().has_npy_shards()) {
      // The shards' headers (mapping them reads nothing else).
      ASSIGN_OR_RETURN(
          Dataset eval,
          LoadDataSource(data.eval(), "", data.seed(), DataSplit::kEval));
      return eval.num_rows();
    }
    ASSIGN_OR_RETURN(NpyHeader header,
                     ReadNpyHeader(data.eval().npy().features()));
    return header.shape.empty() ? 0 : header.shape[0];
  }
  if (data.eval_fraction() > 0) {
    return static_cast<int64_t>(std::floor(
        static_cast<double>(plan.train_rows) * data.eval_fraction()));
  }
  // A forward-only job without eval data runs over all of data.train.
  return plan.trains() ? 0 : plan.train_rows;
}

absl::StatusOr<StageData> LoadStageData(const JobPlan& plan, int stage) {
  StageData out;
  ASSIGN_OR_RETURN(out.eval_rows, EvalRows(plan));
  if (stage != 0) return out;
  const auto& data = plan.spec.data();
  auto with_field = [](const char* field, absl::Status st) {
    return absl::Status(st.code(), absl::StrCat(field, ": ", st.message()));
  };
  if (data.has_eval()) {
    absl::StatusOr<Dataset> eval =
        LoadDataSource(data.eval(), "", data.seed(), DataSplit::kEval);
    if (!eval.ok()) return with_field("data.eval", eval.status());
    out.eval = std::make_shared<Dataset>(*std::move(eval));
  }
  // A forward-only job with data.eval reads nothing else.
  if (!data.has_eval() || plan.trains()) {
    absl::StatusOr<Dataset> train =
        LoadDataSource(data.train(), "", data.seed());
    if (!train.ok()) return with_field("data.train", train.status());
    if (!data.has_eval() && data.eval_fraction() > 0) {
      auto split = SplitTail(*train, data.eval_fraction());
      if (!split.ok()) return with_field("data.eval_fraction", split.status());
      train = std::move(split->first);
      out.eval = std::make_shared<Dataset>(std::move(split->second));
    }
    if (plan.trains()) {
      out.train = std::make_shared<Dataset>(*std::move(train));
    } else if (out.eval == nullptr) {
      out.eval = std::make_shared<Dataset>(*std::move(train));
    }
  }
  if (out.eval != nullptr && out.eval->num_rows() != out.eval_rows) {
    return absl::InternalError(
        absl::StrCat("eval set has ", out.eval->num_rows(),
                     " rows, the plan says ", out.eval_rows));
  }
  return out;
}

absl::StatusOr<int64_t> ResumeStep(const JobPlan& plan,
                                   std::vector<std::string>* set_aside,
                                   int64_t max_step) {
  const auto& ckpt = plan.spec.checkpoint();
  if (ckpt.dir().empty()) return 0;
  // Any committed checkpoint counts here, even one whose manifest no longer
  // parses: it must be set aside (and reported), never silently ignored
  // by a run that would then start over.
  ASSIGN_OR_RETURN(std::optional<int64_t> latest,
                   NewestCommittedStep(ckpt.dir()));
  if (!latest.has_value()) return 0;
  if (ckpt.resume() != "latest") {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint.dir: ", ckpt.dir(),
        " already holds checkpoints (newest: step ", *latest,
        "); set checkpoint.resume to \"latest\" to continue from it, or use "
        "an empty folder"));
  }
  ASSIGN_OR_RETURN(
      VerifiedCheckpoint verified,
      LatestVerifiedCheckpoint(
          ckpt.dir(),
          max_step >= 0 ? max_step : std::numeric_limits<int64_t>::max()));
  for (const std::string& line : verified.set_aside) {
    LOG(WARNING) << "checkpoint set aside: " << line;
    if (set_aside != nullptr) set_aside->push_back(line);
  }
  return verified.step.value_or(0);
}

std::string PlanMetadataJson(const JobPlan& plan, int64_t step) {
  return absl::StrCat("{\"step\":", step, ",\"stages\":", plan.num_stages(),
                      ",\"spec\":", SpecToJson(plan.spec), "}");
}

namespace {

constexpr char kSnapshotTensor[] = "snapshot";

Message SnapshotMessage(int stage, int64_t step, const Tensor& bytes) {
  Message m;
  m.kind = MessageKind::kSnapshot;
  m.step = step;
  m.microbatch = stage;
  // An empty tensor says "not held".
  m.tensors.emplace_back(
      kSnapshotTensor,
      bytes.defined() ? bytes : *Tensor::Create(DType::kUInt8, {int64_t{0}}));
  return m;
}

// The snapshot in a kSnapshot message from `peer`: stage `stage`'s after
// `step` (-1: whichever the message says).
absl::StatusOr<StageSnapshot> SnapshotFromMessage(Message m, int peer,
                                                  int stage, int64_t step) {
  if (m.kind != MessageKind::kSnapshot || (step >= 0 && m.step != step) ||
      (stage >= 0 && m.microbatch != stage) || m.tensors.size() != 1 ||
      m.tensors[0].first != kSnapshotTensor ||
      m.tensors[0].second.dtype() != DType::kUInt8) {
    return absl::DataLossError(
        absl::StrCat("expected a snapshot",
                     stage >= 0 ? absl::StrCat(" of stage ", stage) : "",
                     step >= 0 ? absl::StrCat(" after step ", step) : "",
                     " from rank ", peer, ", got a ", MessageKindName(m.kind),
                     " of step ", m.step, " (", m.tensors.size(), " tensors)"));
  }
  Tensor& t = m.tensors[0].second;
  if (t.nbytes() == 0) {
    return absl::AbortedError(
        absl::StrCat("rank ", peer, " no longer holds the snapshot of stage ",
                     m.microbatch, " after step ", m.step));
  }
  return StageSnapshot{m.microbatch, m.step, std::move(t)};
}

// The stage that keeps a copy of stage k's snapshots.
int SnapshotBuddy(int k, int num_stages) {
  return k + 1 < num_stages ? k + 1 : k - 1;
}

// Snapshot after `step`: serialize, keep, and swap copies with the
// neighbours (SnapshotBuddy), in an order every rank follows.
absl::Status TakeSnapshot(Stage& stage, Transport* transport, int num_stages,
                          int64_t step, const StageRunOptions& options) {
  // One copy: the live buffers straight into the packed tensor.
  ASSIGN_OR_RETURN(SafetensorsFile contents,
                   stage.CheckpointContents(/*stable=*/false));
  ASSIGN_OR_RETURN(Tensor bytes, SerializeSafetensorsToTensor(contents));
  const int k = stage.index();
  if (options.on_snapshot) options.on_snapshot({k, step, bytes});
  if (num_stages < 2) return absl::OkStatus();
  // The buddy takes it in with its next message from this stage
  // (Stage::set_snapshot_sink): no wait here.
  return transport->Send(SnapshotBuddy(k, num_stages),
                         SnapshotMessage(k, step, bytes));
}

}  // namespace

absl::StatusOr<StageSnapshot> DistributeSnapshots(
    Transport* transport, int rank, int64_t step,
    const std::vector<int>& sources,
    const std::function<Tensor(int stage)>& held, absl::Duration timeout) {
  StageSnapshot mine{rank, step, Tensor()};
  const int n = static_cast<int>(sources.size());
  for (int k = 0; k < n; ++k) {
    const int src = sources[k];
    if (src == rank && k == rank) {
      mine.bytes = held(k);
      if (!mine.bytes.defined()) {
        return absl::AbortedError(
            absl::StrCat("this worker no longer holds the snapshot of stage ",
                         k, " after step ", step));
      }
    } else if (src == rank) {
      RETURN_IF_ERROR(transport->Send(k, SnapshotMessage(k, step, held(k))));
    } else if (k == rank) {
      ASSIGN_OR_RETURN(Message m, transport->Recv(src, timeout));
      ASSIGN_OR_RETURN(StageSnapshot got,
                       SnapshotFromMessage(std::move(m), src, k, step));
      mine.bytes = std::move(got.bytes);
    }
  }
  return mine;
}

absl::StatusOr<StartedStage> StartStage(const JobPlan& plan, int index,
                                        Transport* transport,
                                        const StageOptions& options,
                                        const StageSnapshot* snapshot,
                                        int64_t max_resume_step) {
  StartedStage out;
  ASSIGN_OR_RETURN(StageData data, LoadStageData(plan, index));
  ASSIGN_OR_RETURN(out.stage, Stage::Create(plan, index, transport, options,
                                            std::move(data)));
  if (snapshot != nullptr) {
    const Tensor& b = snapshot->bytes;
    RETURN_IF_ERROR(out.stage->RestoreSnapshot(
        absl::string_view(static_cast<const char*>(b.raw_data()), b.nbytes()),
        snapshot->step));
    out.resume_step = snapshot->step;
    return out;
  }
  ASSIGN_OR_RETURN(out.resume_step,
                   ResumeStep(plan, &out.set_aside, max_resume_step));
  if (out.resume_step > 0) {
    RETURN_IF_ERROR(out.stage->RestoreCheckpoint(plan.spec.checkpoint().dir(),
                                                 out.resume_step));
  } else {
    RETURN_IF_ERROR(out.stage->InitParameters());
  }
  return out;
}

namespace {

// A stage's asynchronous checkpoints. When one is due after step N, the
// stage copies its state (CheckpointContents) and the writer thread writes
// the file while training goes on. Each later step's all-reduce counts the
// stages whose file is on disk; once all S are, the first stage's writer
// commits the manifest (and prunes), also in the background. Every
// decision here depends only on step numbers and that reduced count, so
// all stages take the same branches and call the all-reduce equally often.
// A checkpoint still pending when the next one is due, or at the run's
// end, is finished at once: wait for the file, a barrier, the commit. A
// commit is queued only once every stage's file is on disk, so a stage that
// fails or is cancelled still runs its queued commit (and every queued
// write) before it returns: nothing it saved is lost, and nothing changes
// the folder after it returned. A checkpoint whose files were not all
// counted is left uncommitted (a resume takes the one before).
class AsyncCheckpoints {
 public:
  AsyncCheckpoints(Stage& stage, Transport* transport, const JobPlan& plan,
                   const StageRunOptions& options)
      : stage_(stage),
        transport_(transport),
        plan_(plan),
        options_(options),
        dir_(plan.spec.checkpoint().dir()) {}
  // The writer's destructor finishes what is queued, commits included.
  ~AsyncCheckpoints() = default;

  // Before a step: the writer's first error, if any; tells the stage
  // whether the pending checkpoint's file is on disk (for the step's
  // all-reduce count).
  absl::Status BeforeStep() {
    RETURN_IF_ERROR(writer_.status());
    stage_.set_checkpoint_file_written(pending_step_ > 0 &&
                                       writer_.Succeeded(pending_task_));
    return absl::OkStatus();
  }
  // After a step: when every stage's file of the pending checkpoint is on
  // disk, it is committed.
  absl::Status AfterStep(const StepReport& report) {
    if (pending_step_ > 0 &&
        report.checkpoint_files_written == plan_.num_stages()) {
      return AllWritten();
    }
    return absl::OkStatus();
  }
  // Starts the checkpoint after `step` when one is due (finishing the
  // pending one first, and this one at once when `step` is the last).
  absl::Status MaybeSave(int64_t step, int64_t stop);
  // At the run's end: finishes the pending checkpoint and every queued
  // write.
  absl::Status Finish() {
    if (pending_step_ > 0) RETURN_IF_ERROR(FinishNow());
    return writer_.Drain();
  }

 private:
  // Commits (and prunes) the checkpoint after `step`, on the writer's
  // thread.
  absl::Status Commit(int64_t step);
  // Every stage's file of the pending checkpoint is on disk: the first
  // stage's writer commits it next, and the task hears of it now.
  absl::Status AllWritten();
  absl::Status FinishNow();

  Stage& stage_;
  Transport* const transport_;
  const JobPlan& plan_;
  const StageRunOptions& options_;
  const std::string dir_;
  int64_t pending_step_ = 0;  // 0: none
  int64_t pending_task_ = 0;  // the writer's sequence number of its file
  // Declared after what its tasks use: its destructor, which finishes the
  // queued tasks, runs first.
  CheckpointWriter writer_;
};

absl::Status AsyncCheckpoints::Commit(int64_t step) {
  if (options_.may_commit && !options_.may_commit()) {
    LOG(WARNING) << "stage " << stage_.index() << ": checkpoint after step "
                 << step << " left uncommitted (no controller)";
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(CommitCheckpoint(dir_, step, plan_.num_stages(),
                                   PlanMetadataJson(plan_, step)));
  RETURN_IF_ERROR(PruneCheckpoints(dir_, plan_.spec.checkpoint().keep_last()));
  if (options_.on_checkpoint) options_.on_checkpoint(step, dir_);
  return absl::OkStatus();
}

absl::Status AsyncCheckpoints::AllWritten() {
  const int64_t step = pending_step_;
  if (stage_.is_first()) {
    writer_.Submit([this, step] { return Commit(step); });
  }
  pending_step_ = 0;
  return stage_.NotifyTask(TRAINYARD_EVENT_CHECKPOINT_SAVED, dir_, step);
}

absl::Status AsyncCheckpoints::FinishNow() {
  RETURN_IF_ERROR(writer_.WaitFor(pending_task_));
  if (plan_.num_stages() > 1) {
    // Every stage comes here only with its own file written, so the sum is
    // S; checked, since the commit that follows relies on it.
    std::vector<double> done = {1.0};
    RETURN_IF_ERROR(transport_->AllReduceSum(&done, options_.timeout));
    if (done[0] != static_cast<double>(plan_.num_stages())) {
      return absl::InternalError(absl::StrCat(
          "stage ", stage_.index(), ": ", done[0], " of ", plan_.num_stages(),
          " stages have their file of the checkpoint after step ",
          pending_step_, " on disk; not committing it"));
    }
  }
  return AllWritten();
}

absl::Status AsyncCheckpoints::MaybeSave(int64_t step, int64_t stop) {
  const auto& ckpt = plan_.spec.checkpoint();
  if (!options_.write_checkpoints || dir_.empty() ||
      !CheckpointDue(step, ckpt.every(), plan_.spec.steps())) {
    return absl::OkStatus();
  }
  if (pending_step_ > 0) RETURN_IF_ERROR(FinishNow());
  ASSIGN_OR_RETURN(SafetensorsFile contents, stage_.CheckpointContents());
  pending_step_ = step;
  pending_task_ =
      writer_.Submit([dir = dir_, step, k = stage_.index(), &options = options_,
                      file = std::move(contents)]() -> absl::Status {
        const absl::Time start = absl::Now();
        RETURN_IF_ERROR(WriteStageFile(dir, step, k, file).status());
        if (options.on_checkpoint_file) {
          options.on_checkpoint_file(
              absl::ToDoubleSeconds(absl::Now() - start));
        }
        return absl::OkStatus();
      });
  if (step == stop) RETURN_IF_ERROR(FinishNow());
  return absl::OkStatus();
}

// Takes in the neighbours' snapshots with the next step's messages.
void SetSnapshotSink(Stage& stage, int num_stages,
                     const StageRunOptions& options) {
  stage.set_snapshot_sink([&options, S = num_stages, k = stage.index()](
                              int peer, Message m) -> absl::Status {
    if (SnapshotBuddy(peer, S) != k) {
      return absl::DataLossError(absl::StrCat(
          "stage ", k, " got a snapshot from rank ", peer,
          ", which keeps its copies on stage ", SnapshotBuddy(peer, S)));
    }
    ASSIGN_OR_RETURN(StageSnapshot snap,
                     SnapshotFromMessage(std::move(m), peer, peer, -1));
    if (options.on_snapshot) options.on_snapshot(std::move(snap));
    return absl::OkStatus();
  });
}

// After step `step`'s report went out: the snapshot, then the eval, when
// due. The snapshot goes first so that its swap is the next message between
// neighbours on every rank. Like the eval's, its time is not part of the
// step's (docs/BENCHMARKS.md measures it).
absl::Status SnapshotAndEval(Stage& stage, Transport* transport,
                             const JobPlan& plan,
                             const StageRunOptions& options, int64_t step,
                             int64_t stop, int64_t eval_rows) {
  if (options.snapshot_every > 0 && step % options.snapshot_every == 0 &&
      step < stop) {
    RETURN_IF_ERROR(
        TakeSnapshot(stage, transport, plan.num_stages(), step, options));
  }
  if (eval_rows > 0 &&
      Due(step, plan.spec.data().eval_every(), plan.spec.steps())) {
    ASSIGN_OR_RETURN(EvalReport eval, stage.RunEval());
    if (options.on_eval) options.on_eval(step, eval);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckResumedTogether(Stage& stage, Transport* transport,
                                  int num_stages, absl::Duration timeout) {
  if (num_stages <= 1) return absl::OkStatus();
  std::vector<double> resumed = {static_cast<double>(stage.completed_steps())};
  RETURN_IF_ERROR(transport->AllReduceSum(&resumed, timeout));
  if (resumed[0] != static_cast<double>(num_stages) * stage.completed_steps()) {
    // Aborted, not FailedPrecondition: a restart settles it.
    return absl::AbortedError(absl::StrCat(
        "stage ", stage.index(), " resumed after step ",
        stage.completed_steps(),
        " but the stages did not all resume from the same checkpoint (a "
        "checkpoint was set aside while they started?)"));
  }
  return absl::OkStatus();
}

absl::Status RunStage(Stage& stage, Transport* transport, const JobPlan& plan,
                      const StageRunOptions& options) {
  RETURN_IF_ERROR(stage.exec().Activate());
  const int64_t last_step = plan.spec.steps();
  const int64_t stop = options.stop_after_step > 0
                           ? std::min(options.stop_after_step, last_step)
                           : last_step;
  ASSIGN_OR_RETURN(const int64_t eval_rows, EvalRows(plan));
  AsyncCheckpoints checkpoints(stage, transport, plan, options);
  if (options.snapshot_every > 0) {
    SetSnapshotSink(stage, plan.num_stages(), options);
  }
  absl::Cleanup no_sink = [&stage] { stage.set_snapshot_sink(nullptr); };
  RETURN_IF_ERROR(CheckResumedTogether(stage, transport, plan.num_stages(),
                                       options.timeout));
  absl::Time step_start = absl::Now();
  while (stage.completed_steps() < stop) {
    if (options.cancel != nullptr && options.cancel->load()) {
      return absl::CancelledError(absl::StrCat("stage ", stage.index(),
                                               " cancelled after step ",
                                               stage.completed_steps()));
    }
    RETURN_IF_ERROR(checkpoints.BeforeStep());
    ASSIGN_OR_RETURN(StepReport report, stage.RunStep());
    RETURN_IF_ERROR(checkpoints.AfterStep(report));
    if (options.on_step) {
      options.on_step(report, absl::ToDoubleSeconds(absl::Now() - step_start));
    }
    RETURN_IF_ERROR(SnapshotAndEval(stage, transport, plan, options,
                                    report.step, stop, eval_rows));
    RETURN_IF_ERROR(checkpoints.MaybeSave(report.step, stop));
    step_start = absl::Now();
  }
  RETURN_IF_ERROR(checkpoints.Finish());
  RETURN_IF_ERROR(stage.NotifyTask(
      TRAINYARD_EVENT_JOB_END, stop == last_step ? "completed" : "stopped"));
  return stage.Finalize();
}

}  // namespace trainyard
