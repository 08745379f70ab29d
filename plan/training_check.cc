#include "plan/training_check.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "plan/spec_paths.h"

namespace trainyard {
namespace {

using trainyard::v1::JobSpec;
using trainyard::v1::OptimizerSpec;

void CheckNonNegative(const char* field, double v, Problems* p) {
  if (!std::isfinite(v) || v < 0) {
    p->Add(absl::StrCat("optimizer.", field),
           absl::StrCat("must be >= 0 and finite, got ", FormatDouble(v)));
  }
}

// AdamW's defaults and ranges; SGD's fields are refused.
void CheckAdamw(OptimizerSpec* opt, Problems* p) {
  if (!opt->has_beta1()) opt->set_beta1(0.9);
  if (!opt->has_beta2()) opt->set_beta2(0.999);
  if (!opt->has_eps()) opt->set_eps(1e-8);
  if (!opt->has_weight_decay()) opt->set_weight_decay(0.01);
  for (auto [field, v] : {std::make_pair("beta1", opt->beta1()),
                          std::make_pair("beta2", opt->beta2())}) {
    if (!(v >= 0 && v < 1)) {
      p->Add(absl::StrCat("optimizer.", field),
             absl::StrCat("must be in [0, 1), got ", FormatDouble(v)));
    }
  }
  if (!std::isfinite(opt->eps()) || opt->eps() <= 0) {
    p->Add("optimizer.eps", absl::StrCat("must be > 0 and finite, got ",
                                         FormatDouble(opt->eps())));
  }
  if (opt->momentum() != 0) p->Add("optimizer.momentum", "only for sgd");
  if (opt->dampening() != 0) p->Add("optimizer.dampening", "only for sgd");
  if (opt->nesterov()) p->Add("optimizer.nesterov", "only for sgd");
}

// SGD's defaults and ranges; AdamW's fields are refused.
void CheckSgd(OptimizerSpec* opt, Problems* p) {
  if (opt->has_beta1()) p->Add("optimizer.beta1", "only for adamw");
  if (opt->has_beta2()) p->Add("optimizer.beta2", "only for adamw");
  if (opt->has_eps()) p->Add("optimizer.eps", "only for adamw");
  if (!opt->has_weight_decay()) opt->set_weight_decay(0.0);
  CheckNonNegative("momentum", opt->momentum(), p);
  if (!(opt->dampening() >= 0 && opt->dampening() <= 1)) {
    p->Add("optimizer.dampening", absl::StrCat("must be in [0, 1], got ",
                                               FormatDouble(opt->dampening())));
  }
  if (opt->nesterov() && (opt->momentum() <= 0 || opt->dampening() != 0)) {
    p->Add("optimizer.nesterov",
           absl::StrCat("requires momentum > 0 and dampening == 0 (as "
                        "torch.optim.SGD), got momentum ",
                        FormatDouble(opt->momentum()), ", dampening ",
                        FormatDouble(opt->dampening())));
  }
}

// decay_mask (default "default") and its no_decay patterns.
void CheckDecayMask(OptimizerSpec* opt, Problems* p) {
  if (opt->decay_mask().empty()) opt->set_decay_mask("default");
  CheckOneOf(p, "optimizer.decay_mask", opt->decay_mask(),
             {"default", "all", "patterns"});
  const bool patterns = opt->decay_mask() == "patterns";
  if (patterns && opt->no_decay_size() == 0) {
    p->Add("optimizer.no_decay",
           "decay_mask \"patterns\" needs at least one pattern");
  } else if (!patterns && opt->no_decay_size() > 0) {
    p->Add("optimizer.no_decay",
           absl::StrCat("only for decay_mask \"patterns\", got decay_mask ",
                        Quote(opt->decay_mask())));
  }
  for (int i = 0; i < opt->no_decay_size(); ++i) {
    const std::string& pat = opt->no_decay(i);
    if (!ValidNoDecayPattern(pat)) {
      p->Add(absl::StrCat("optimizer.no_decay[", i, "]"),
             absl::StrCat("must be a non-empty glob of [A-Za-z0-9_.*], got ",
                          Quote(pat)));
    }
  }
}

// The lr schedule (default "constant" over all `steps`).
void CheckLrSchedule(int64_t steps, OptimizerSpec* opt, Problems* p) {
  trainyard::v1::LrScheduleSpec* sched = opt->mutable_schedule();
  if (sched->type().empty()) sched->set_type("constant");
  CheckOneOf(p, "optimizer.schedule.type", sched->type(),
             {"constant", "cosine", "linear"});
  if (sched->total_steps() == 0) sched->set_total_steps(steps);
  const bool decaying = sched->type() == "cosine" || sched->type() == "linear";
  if (sched->warmup_steps() < 0) {
    p->Add("optimizer.schedule.warmup_steps",
           absl::StrCat("must be >= 0, got ", sched->warmup_steps()));
  } else if (decaying && sched->total_steps() > 0 &&
             sched->warmup_steps() >= sched->total_steps()) {
    p->Add("optimizer.schedule.warmup_steps",
           absl::StrCat("must be < total steps (", sched->total_steps(),
                        ") when decaying, got ", sched->warmup_steps()));
  }
  if (sched->total_steps() < 0) {
    p->Add("optimizer.schedule.total_steps",
           absl::StrCat("must be >= 0, got ", sched->total_steps()));
  }
  if (decaying) {
    if (!(sched->min_lr() >= 0 && sched->min_lr() <= opt->lr())) {
      p->Add("optimizer.schedule.min_lr",
             absl::StrCat("must be in [0, lr] = [0, ", FormatDouble(opt->lr()),
                          "], got ", FormatDouble(sched->min_lr())));
    }
  } else if (sched->min_lr() != 0) {
    p->Add("optimizer.schedule.min_lr",
           absl::StrCat("only for schedule type \"cosine\" or \"linear\", got ",
                        Quote(sched->type())));
  }
}

bool ValidName(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) {
      return false;
    }
  }
  return true;
}

}  // namespace

void CheckOptimizer(Problems* p, JobSpec* spec) {
  OptimizerSpec* opt = spec->mutable_optimizer();
  if (opt->type().empty()) opt->set_type("adamw");
  const bool type_ok =
      CheckOneOf(p, "optimizer.type", opt->type(), {"adamw", "sgd"});
  if (!std::isfinite(opt->lr()) || opt->lr() <= 0) {
    p->Add("optimizer.lr", absl::StrCat("must be > 0 and finite, got ",
                                        FormatDouble(opt->lr())));
  }
  if (opt->type() == "adamw") {
    CheckAdamw(opt, p);
  } else if (opt->type() == "sgd") {
    CheckSgd(opt, p);
  }
  if (type_ok) CheckNonNegative("weight_decay", opt->weight_decay(), p);
  CheckNonNegative("clip_grad", opt->clip_grad(), p);
  CheckDecayMask(opt, p);
  CheckLrSchedule(spec->steps(), opt, p);
}

bool ValidNoDecayPattern(const std::string& pattern) {
  return !pattern.empty() &&
         std::all_of(pattern.begin(), pattern.end(), [](char c) {
           return std::isalnum(static_cast<unsigned char>(c)) || c == '_' ||
                  c == '.' || c == '*';
         });
}

void CheckTask(const JobSpec& spec, Problems* p) {
  if (!ValidName(spec.task().plugin())) {
    p->Add("task.plugin", spec.task().plugin().empty()
                              ? std::string("required")
                              : absl::StrCat("must match [A-Za-z0-9_]+, got ",
                                             Quote(spec.task().plugin())));
  }
}

void CheckCheckpoint(const PlanOptions& options, Problems* p, JobSpec* spec) {
  trainyard::v1::CheckpointSpec* ckpt = spec->mutable_checkpoint();
  if (ckpt->every() < 0) {
    p->Add("checkpoint.every",
           absl::StrCat("must be >= 0, got ", ckpt->every()));
  }
  if (ckpt->keep_last() < 0) {
    p->Add("checkpoint.keep_last",
           absl::StrCat("must be >= 0, got ", ckpt->keep_last()));
  }
  if (ckpt->resume().empty()) ckpt->set_resume("never");
  CheckOneOf(p, "checkpoint.resume", ckpt->resume(), {"never", "latest"});
  if (ckpt->dir().empty()) {
    if (ckpt->every() > 0) p->Add("checkpoint.every", "needs checkpoint.dir");
    if (ckpt->keep_last() > 0) {
      p->Add("checkpoint.keep_last", "needs checkpoint.dir");
    }
    if (ckpt->resume() == "latest") {
      p->Add("checkpoint.resume", "\"latest\" needs checkpoint.dir");
    }
  } else {
    const std::string written = ckpt->dir();
    ckpt->set_dir(ResolvePath(options.base_dir, written));
    CheckConfined(p, "checkpoint.dir", written, ckpt->dir(), options);
  }
}

void CheckRecovery(Problems* p, JobSpec* spec) {
  trainyard::v1::RecoverySpec* rec = spec->mutable_recovery();
  if (!rec->has_max_restarts()) rec->set_max_restarts(kDefaultMaxRestarts);
  if (!rec->has_backoff_ms()) rec->set_backoff_ms(kDefaultRestartBackoffMs);
  if (rec->max_restarts() < 0 || rec->max_restarts() > kMaxRestartsLimit) {
    p->Add("recovery.max_restarts",
           absl::StrCat("must be in [0, ", kMaxRestartsLimit, "], got ",
                        rec->max_restarts()));
  }
  if (rec->snapshot_every() < 0) {
    p->Add("recovery.snapshot_every",
           absl::StrCat("must be >= 0, got ", rec->snapshot_every()));
  }
  if (rec->backoff_ms() < 0 || rec->backoff_ms() > kMaxRestartBackoffMs) {
    p->Add("recovery.backoff_ms",
           absl::StrCat("must be in [0, ", kMaxRestartBackoffMs, "], got ",
                        rec->backoff_ms()));
  }
}

}  // namespace trainyard
