#include "plan/inference_check.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "plan/spec_paths.h"

namespace trainyard {
namespace {

using trainyard::v1::InferenceSpec;
using trainyard::v1::JobSpec;

// What only a training job gives, refused in a forward-only one.
void CheckNoTraining(const JobSpec& s, Problems* p) {
  const std::string why =
      absl::StrCat("only for kind \"train\", got kind ", Quote(s.kind()));
  // An empty message ("checkpoint": {}) gives nothing.
  if (s.steps() != 0) p->Add("steps", why);
  if (s.optimizer().ByteSizeLong() > 0) p->Add("optimizer", why);
  if (s.checkpoint().ByteSizeLong() > 0) {
    p->Add("checkpoint", absl::StrCat(why,
                                      " (the model's checkpoint is "
                                      "inference.checkpoint_dir)"));
  }
  if (s.data().eval_every() != 0) p->Add("data.eval_every", why);
  if (s.data().shuffle()) {
    p->Add("data.shuffle", absl::StrCat(why, " (rows are read in order)"));
  }
}

// inference.checkpoint_dir / checkpoint_step, or model.init.safetensors.
void CheckModelSource(const PlanOptions& options, Problems* p, JobSpec* s) {
  InferenceSpec* inf = s->mutable_inference();
  const bool from_init = !s->model().init().safetensors().empty();
  if (inf->checkpoint_dir().empty()) {
    if (!from_init) {
      p->Add("inference.checkpoint_dir",
             absl::StrCat("an ", s->kind(),
                          " job needs a trained model: "
                          "inference.checkpoint_dir or "
                          "model.init.safetensors"));
    }
    if (inf->checkpoint_step() != 0) {
      p->Add("inference.checkpoint_step", "needs inference.checkpoint_dir");
    }
    return;
  }
  if (from_init) {
    p->Add("inference.checkpoint_dir",
           "give either inference.checkpoint_dir or model.init.safetensors, "
           "not both");
  }
  if (inf->checkpoint_step() < 0) {
    p->Add("inference.checkpoint_step",
           absl::StrCat("must be >= 0 (0: the newest), got ",
                        inf->checkpoint_step()));
  }
  const std::string written = inf->checkpoint_dir();
  inf->set_checkpoint_dir(ResolvePath(options.base_dir, written));
  CheckConfined(p, "inference.checkpoint_dir", written, inf->checkpoint_dir(),
                options);
}

// inference.output_dir and shard_rows: an infer job's, nobody else's.
void CheckOutputs(const PlanOptions& options, Problems* p, JobSpec* s) {
  InferenceSpec* inf = s->mutable_inference();
  if (s->kind() != "infer") {
    const std::string why =
        absl::StrCat("only for kind \"infer\", got kind ", Quote(s->kind()));
    if (!inf->output_dir().empty()) p->Add("inference.output_dir", why);
    if (inf->shard_rows() != 0) p->Add("inference.shard_rows", why);
    return;
  }
  if (inf->shard_rows() == 0) inf->set_shard_rows(kDefaultShardRows);
  if (inf->shard_rows() < 0) {
    p->Add("inference.shard_rows",
           absl::StrCat("must be > 0, got ", inf->shard_rows()));
  }
  if (inf->output_dir().empty()) {
    p->Add("inference.output_dir", "required for kind \"infer\"");
    return;
  }
  const std::string written = inf->output_dir();
  inf->set_output_dir(ResolvePath(options.base_dir, written));
  CheckConfined(p, "inference.output_dir", written, inf->output_dir(), options);
}

}  // namespace

bool CheckJobKind(const PlanOptions& options, Problems* p, JobPlan* plan) {
  JobSpec* s = &plan->spec;
  if (s->kind().empty()) s->set_kind("train");
  if (!CheckOneOf(p, "kind", s->kind(), {"train", "infer", "eval"})) {
    return false;
  }
  if (s->kind() == "train") {
    plan->kind = JobKind::kTrain;
    if (s->has_inference()) {
      p->Add("inference", "only for kind \"infer\" or \"eval\"");
    }
    return true;
  }
  plan->kind = s->kind() == "infer" ? JobKind::kInfer : JobKind::kEval;
  CheckNoTraining(*s, p);
  CheckModelSource(options, p, s);
  CheckOutputs(options, p, s);
  return true;
}

}  // namespace trainyard
