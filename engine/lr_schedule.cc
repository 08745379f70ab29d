#include "engine/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "glog/logging.h"

namespace trainyard {

double LearningRate(const trainyard::v1::OptimizerSpec& opt, int64_t step) {
  const double lr = opt.lr();
  const trainyard::v1::LrScheduleSpec& sched = opt.schedule();
  const int64_t warmup = std::max<int64_t>(0, sched.warmup_steps());
  if (step < warmup) {
    return lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  }
  const std::string& type = sched.type();
  if (type.empty() || type == "constant") return lr;
  CHECK(type == "cosine" || type == "linear")
      << "LearningRate: unknown schedule type \"" << type
      << "\" (PlanJob should have rejected it)";
  const int64_t total = sched.total_steps();
  double progress = 0.0;
  if (total > 0) {
    progress = static_cast<double>(step - warmup) /
               static_cast<double>(std::max<int64_t>(1, total - warmup));
    progress = std::min(1.0, std::max(0.0, progress));
  }
  const double min_lr = sched.min_lr();
  if (type == "cosine") {
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * progress));
  }
  return lr + (min_lr - lr) * progress;
}

}  // namespace trainyard
