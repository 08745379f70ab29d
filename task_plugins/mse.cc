// Task plugin "mse": torch.nn.MSELoss() (reduction "mean" over every
// element) against float32 [B, K] targets.
//
// Config: {} or {"reduction": "mean"}.
// State passed to compute_loss: "targets" float32 [B, K].
// loss_weight = rows in the microbatch, so the engine's weighted combination
// of microbatch means is the full-batch mean. Metrics per step: "loss".
#include <cmath>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "task_plugins/plugin_sdk.h"

namespace trainyard {
namespace plugin {
namespace {

class MseTask : public PluginTask {
 public:
  static std::set<std::string> ConfigKeys() { return {"reduction"}; }

  // Touches nothing: the same call serves validate_config.
  static absl::StatusOr<std::unique_ptr<PluginTask>> Create(
      const nlohmann::json& config, const CreateContext&) {
    absl::StatusOr<std::string> reduction =
        GetString(config, "reduction", "mean");
    if (!reduction.ok()) return reduction.status();
    if (*reduction != "mean") {
      return absl::InvalidArgumentError(absl::StrCat(
          "task.config.reduction: only \"mean\" is supported, got \"",
          *reduction, "\""));
    }
    return std::unique_ptr<PluginTask>(new MseTask());
  }

  absl::Status BuildForwardInputs(const TrainyardBatch& batch,
                                  TrainyardSink* out) override {
    absl::StatusOr<const TrainyardTensor*> features =
        CopyFeaturesToInputs(batch, out);
    if (!features.ok()) return features.status();
    absl::StatusOr<const TrainyardTensor*> targets =
        FindTensor(batch.tensors, batch.num_tensors, "targets");
    if (!targets.ok()) return targets.status();
    const TrainyardTensor& t = **targets;
    if (t.dtype != TRAINYARD_FLOAT32 || t.ndim != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("mse needs float32 [B, K] \"targets\", got ",
                       DTypeString(t.dtype), " ", ShapeString(t)));
    }
    absl::StatusOr<void*> p =
        AddTensor(out, "targets", TRAINYARD_FLOAT32, {t.shape[0], t.shape[1]});
    if (!p.ok()) return p.status();
    const int64_t n = NumElements(t);
    if (n > 0) std::memcpy(*p, t.data, n * sizeof(float));
    return absl::OkStatus();
  }

  absl::Status ComputeLoss(const TrainyardLossArgs& args,
                           TrainyardLossResult* result,
                           TrainyardSink* metrics) override {
    const TrainyardTensor& out = *args.output;
    absl::StatusOr<const TrainyardTensor*> targets =
        FindTensor(args.state, args.num_state, "targets");
    if (!targets.ok()) return targets.status();
    const TrainyardTensor& t = **targets;
    if (t.dtype != TRAINYARD_FLOAT32 || t.ndim != out.ndim ||
        std::memcmp(t.shape, out.shape, sizeof(int64_t) * out.ndim) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "microbatch ", args.microbatch, ": targets ", DTypeString(t.dtype),
          " ", ShapeString(t), " do not match the model output float32 ",
          ShapeString(out)));
    }
    const int64_t rows = out.ndim > 0 ? out.shape[0] : 1;
    const int64_t n = NumElements(out);
    if (n == 0) {
      result->loss = 0;
      result->loss_weight = 0;
      return absl::OkStatus();
    }
    const float* o = static_cast<const float*>(out.data);
    const float* y = static_cast<const float*>(t.data);
    float* g =
        args.is_eval ? nullptr : static_cast<float*>(args.grad_output->data);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double d = static_cast<double>(o[i]) - y[i];
      sum += d * d;
      if (g != nullptr) g[i] = static_cast<float>(2.0 * d / n);
    }
    result->loss = sum / n;
    result->loss_weight = static_cast<double>(rows);
    Accum& a = accum_[args.is_eval ? 1 : 0];
    a.sum_sq += sum;
    a.count += n;
    return absl::OkStatus();
  }

  absl::Status UpdateMetrics(bool is_eval, TrainyardSink* out) override {
    Accum& a = accum_[is_eval ? 1 : 0];
    if (a.count > 0) out->add_metric(out->ctx, "loss", a.sum_sq / a.count);
    a = Accum();
    return absl::OkStatus();
  }

 private:
  struct Accum {
    double sum_sq = 0;
    int64_t count = 0;
  };
  Accum accum_[2];  // [train, eval]
};

}  // namespace
}  // namespace plugin
}  // namespace trainyard

TRAINYARD_EXPORT_TASK_PLUGIN(trainyard::plugin::MseTask, "mse")
