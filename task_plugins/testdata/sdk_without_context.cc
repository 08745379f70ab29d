// An SDK plugin whose Create takes only the config (as written before
// CreateContext): the SDK gives its table no validate_config and no
// create_confined, since it cannot know that Create opens no files nor
// confine the paths it reads.
//
// Config: {"path": "<any string>"} (optional). inputs = features; loss 0.
#include <memory>
#include <set>
#include <string>

#include "task_plugins/plugin_sdk.h"

namespace {

using trainyard::plugin::PluginTask;

class SdkWithoutContextTask : public PluginTask {
 public:
  static std::set<std::string> ConfigKeys() { return {"path"}; }
  static absl::StatusOr<std::unique_ptr<PluginTask>> Create(
      const nlohmann::json& config) {
    absl::StatusOr<std::string> path =
        trainyard::plugin::GetString(config, "path", "");
    if (!path.ok()) return path.status();
    return std::unique_ptr<PluginTask>(new SdkWithoutContextTask());
  }
  absl::Status BuildForwardInputs(const TrainyardBatch& batch,
                                  TrainyardSink* out) override {
    return trainyard::plugin::CopyFeaturesToInputs(batch, out).status();
  }
  absl::Status ComputeLoss(const TrainyardLossArgs&,
                           TrainyardLossResult* result,
                           TrainyardSink*) override {
    result->loss = 0;
    result->loss_weight = 0;
    return absl::OkStatus();
  }
  absl::Status UpdateMetrics(bool, TrainyardSink*) override {
    return absl::OkStatus();
  }
};

}  // namespace

TRAINYARD_EXPORT_TASK_PLUGIN(SdkWithoutContextTask, "sdk_without_context")
