#include "controller/job_manager_options.h"

namespace trainyard {

PlanOptions ControllerPlanOptions(const JobManagerOptions& manager) {
  PlanOptions options = PlanOptions::ShapeOnly();
  if (!manager.job_data_dir.empty()) {
    // Relative paths resolve on the workers, against the same folder.
    options.base_dir = manager.job_data_dir;
    options.confine_to = manager.job_data_dir;
    options.confine_flag = "the controller's --job_data_dir";
  }
  return options;
}

}  // namespace trainyard
