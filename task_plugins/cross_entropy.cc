// Task plugin "cross_entropy": torch.nn.CrossEntropyLoss with class-index
// targets, ignore_index and label_smoothing, reduction "mean".
//
// Config: {"ignore_index": -100, "label_smoothing": 0.0} (both optional).
// Targets: int32/int64 [B], passed to compute_loss as "labels" int64 [B].
// Per sample (PyTorch's formula), with log p = log_softmax(logits), C
// classes and eps = label_smoothing:
//   loss_i = (1 - eps) * -log p[y_i] + eps * mean_c(-log p[c])
// loss = mean of loss_i over non-ignored samples; loss_weight = their count,
// so the engine's weighted combination gives the full-batch loss.
// Metrics per step (update_metrics): "loss" and "accuracy" over non-ignored
// samples (argmax, first maximum on ties), when there were any.
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "task_plugins/plugin_sdk.h"

namespace trainyard {
namespace plugin {
namespace {

class CrossEntropyTask : public PluginTask {
 public:
  static std::set<std::string> ConfigKeys() {
    return {"ignore_index", "label_smoothing"};
  }

  // Touches nothing: the same call serves validate_config.
  static absl::StatusOr<std::unique_ptr<PluginTask>> Create(
      const nlohmann::json& config, const CreateContext&) {
    absl::StatusOr<int64_t> ignore = GetInt(config, "ignore_index", -100);
    if (!ignore.ok()) return ignore.status();
    absl::StatusOr<double> eps = GetNumber(config, "label_smoothing", 0.0);
    if (!eps.ok()) return eps.status();
    if (*eps < 0 || *eps > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "task.config.label_smoothing: must be in [0, 1], got ", *eps));
    }
    return std::unique_ptr<PluginTask>(new CrossEntropyTask(*ignore, *eps));
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
    if (!IsLabelTensor(t)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cross_entropy needs class-index \"targets\" int32/int64 [B], got ",
          DTypeString(t.dtype), " ", ShapeString(t)));
    }
    absl::StatusOr<void*> p =
        AddTensor(out, "labels", TRAINYARD_INT64, {t.shape[0]});
    if (!p.ok()) return p.status();
    int64_t* labels = static_cast<int64_t*>(*p);
    for (int64_t i = 0; i < t.shape[0]; ++i) labels[i] = LabelAt(t, i);
    return absl::OkStatus();
  }

  absl::Status ComputeLoss(const TrainyardLossArgs& args,
                           TrainyardLossResult* result,
                           TrainyardSink* metrics) override {
    const TrainyardTensor& out = *args.output;
    absl::StatusOr<const TrainyardTensor*> found =
        FindTensor(args.state, args.num_state, "labels");
    if (!found.ok()) return found.status();
    const TrainyardTensor& labels = **found;
    if (!IsLabelTensor(labels) || labels.shape[0] != out.shape[0]) {
      return absl::InvalidArgumentError(
          absl::StrCat("microbatch ", args.microbatch,
                       ": \"labels\" must be int [", out.shape[0], "], got ",
                       DTypeString(labels.dtype), " ", ShapeString(labels)));
    }
    const int64_t b = out.shape[0];
    const int64_t c = out.shape[1];
    const float* x = static_cast<const float*>(out.data);
    float* g =
        args.is_eval ? nullptr : static_cast<float*>(args.grad_output->data);
    // Validate every label before touching anything.
    absl::StatusOr<int64_t> valid =
        CountValidLabels(labels, b, c, ignore_index_, args);
    if (!valid.ok()) return valid.status();
    const int64_t n = *valid;
    result->loss = 0;
    result->loss_weight = static_cast<double>(n);
    if (n == 0) return absl::OkStatus();
    std::vector<double> logp(c);
    double sum = 0;
    int64_t correct = 0;
    for (int64_t i = 0; i < b; ++i) {
      const int64_t y = LabelAt(labels, i);
      if (y == ignore_index_) continue;
      const float* row = x + i * c;
      LogSoftmaxRow(row, c, 1.0, logp.data());
      double smooth = 0;
      for (int64_t k = 0; k < c; ++k) smooth -= logp[k];
      sum += (1 - eps_) * -logp[y] + eps_ * smooth / c;
      int64_t argmax = 0;
      for (int64_t k = 1; k < c; ++k) {
        if (row[k] > row[argmax]) argmax = k;
      }
      if (argmax == y) ++correct;
      if (g != nullptr) {
        float* grow = g + i * c;
        for (int64_t k = 0; k < c; ++k) {
          const double target = (k == y ? 1 - eps_ : 0.0) + eps_ / c;
          grow[k] = static_cast<float>((std::exp(logp[k]) - target) / n);
        }
      }
    }
    result->loss = sum / n;
    Accum& a = accum_[args.is_eval ? 1 : 0];
    a.loss_sum += sum;
    a.correct += correct;
    a.count += n;
    return absl::OkStatus();
  }

  absl::Status UpdateMetrics(bool is_eval, TrainyardSink* out) override {
    Accum& a = accum_[is_eval ? 1 : 0];
    if (a.count > 0) {
      out->add_metric(out->ctx, "loss", a.loss_sum / a.count);
      out->add_metric(out->ctx, "accuracy",
                      static_cast<double>(a.correct) / a.count);
    }
    a = Accum();
    return absl::OkStatus();
  }

 private:
  CrossEntropyTask(int64_t ignore_index, double eps)
      : ignore_index_(ignore_index), eps_(eps) {}

  struct Accum {
    double loss_sum = 0;
    int64_t correct = 0;
    int64_t count = 0;
  };
  const int64_t ignore_index_;
  const double eps_;
  Accum accum_[2];  // [train, eval]
};

}  // namespace
}  // namespace plugin
}  // namespace trainyard

TRAINYARD_EXPORT_TASK_PLUGIN(trainyard::plugin::CrossEntropyTask,
                             "cross_entropy")
