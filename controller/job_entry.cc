#include "controller/job_entry.h"

#include "absl/strings/str_cat.h"

namespace trainyard {
namespace {

void RestorePath(const std::string& submitted, std::string* normalized) {
  if (!submitted.empty() && submitted[0] != '/') *normalized = submitted;
}

void RestoreSource(const v1::DataSource& submitted, v1::DataSource* out) {
  if (submitted.has_npy_shards() && out->has_npy_shards()) {
    const auto& in = submitted.npy_shards();
    auto* shards = out->mutable_npy_shards();
    for (int i = 0; i < in.features_size() && i < shards->features_size();
         ++i) {
      RestorePath(in.features(i), shards->mutable_features(i));
    }
    for (int i = 0; i < in.targets_size() && i < shards->targets_size(); ++i) {
      RestorePath(in.targets(i), shards->mutable_targets(i));
    }
  }
  if (submitted.has_npy() && out->has_npy()) {
    RestorePath(submitted.npy().features(),
                out->mutable_npy()->mutable_features());
    RestorePath(submitted.npy().targets(),
                out->mutable_npy()->mutable_targets());
  }
}

}  // namespace

v1::JobSpec WorkerSpec(const v1::JobSpec& submitted,
                       const v1::JobSpec& plan_spec) {
  v1::JobSpec spec = plan_spec;
  RestoreSource(submitted.data().train(), spec.mutable_data()->mutable_train());
  if (spec.data().has_eval()) {
    RestoreSource(submitted.data().eval(), spec.mutable_data()->mutable_eval());
  }
  RestorePath(submitted.model().init().safetensors(),
              spec.mutable_model()->mutable_init()->mutable_safetensors());
  if (spec.has_checkpoint()) {
    RestorePath(submitted.checkpoint().dir(),
                spec.mutable_checkpoint()->mutable_dir());
  }
  if (spec.has_inference()) {
    RestorePath(submitted.inference().checkpoint_dir(),
                spec.mutable_inference()->mutable_checkpoint_dir());
    RestorePath(submitted.inference().output_dir(),
                spec.mutable_inference()->mutable_output_dir());
  }
  return spec;
}

void SetPlan(JobEntry& e, const JobPlan& plan) {
  e.gang = plan.gang();
  e.loss_rank = e.gang.RankOf(e.gang.replicas - 1, plan.loss_stage());
  e.worker_spec = WorkerSpec(e.job.spec(), plan.spec);
  e.max_restarts = e.worker_spec.recovery().max_restarts();
  e.backoff_ms = e.worker_spec.recovery().backoff_ms();
}

std::string RankLabel(int rank, const Gang& gang) {
  if (gang.replicas <= 1) return absl::StrCat("stage ", rank);
  return absl::StrCat("rank ", rank, " (stage ", gang.StageOf(rank),
                      " of replica ", gang.ReplicaOf(rank), ")");
}

std::string WorkerLabel(const WorkerEntry& w) {
  return absl::StrCat(w.id, " (", w.name, ")");
}

std::string RestartLabel(const JobEntry& e) {
  return absl::StrCat("restart ", e.job.restarts(), " of ", e.max_restarts);
}

}  // namespace trainyard
