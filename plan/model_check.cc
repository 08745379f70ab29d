#include "plan/model_check.h"

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/block_config.h"
#include "plan/spec_paths.h"

namespace trainyard {
namespace {

using trainyard::v1::BlockSpec;

// Block `i`'s widths (`path` is its field path), its input against
// `prev_out` (the width feeding it; 0 = unknown), which fills in an unset
// in_features. `train_reported`: the data's own problem was reported.
bool CheckBlockWidths(const std::string& path, int i, int64_t prev_out,
                      bool train_reported, BlockSpec* b, Problems* p) {
  bool ok = true;
  auto check_width = [&](const char* field, int64_t v, bool zero_ok) {
    if ((zero_ok ? v < 0 : v <= 0) || v > kMaxWidth) {
      p->Add(absl::StrCat(path, ".", field),
             absl::StrCat(zero_ok ? "must be >= 0" : "must be > 0",
                          v > kMaxWidth ? absl::StrCat(" and <= ", kMaxWidth)
                                        : std::string(),
                          ", got ", v));
      ok = false;
    }
  };
  check_width("out_features", b->out_features(), false);
  check_width("ffn_hidden_size", b->ffn_hidden_size(), false);
  check_width("in_features", b->in_features(), true);
  if (b->in_features() > 0 && prev_out > 0 && b->in_features() != prev_out) {
    p->Add(path + ".in_features",
           absl::StrCat(
               "must match ",
               i == 0 ? "the data's feature count"
                      : absl::StrCat("model.blocks[", i - 1, "].out_features"),
               " (", prev_out, "), got ", b->in_features()));
    ok = false;
  }
  if (b->in_features() == 0 && prev_out > 0) b->set_in_features(prev_out);
  if (b->in_features() == 0) {
    ok = false;
    // Block 0 with unknown data width: say so unless the data's own
    // problem was already reported (later blocks: the previous block's
    // out_features problem was).
    if (i == 0 && !train_reported) {
      p->Add(path + ".in_features",
             "cannot be inferred: the data's feature count is unknown "
             "(files not checked); set it");
    }
  }
  return ok;
}

// The block's activation and norm (defaults "gelu" and "none") into
// `config`, its bias default (on), and a residual's equal widths.
bool CheckBlockKinds(const std::string& path, BlockSpec* b, Problems* p,
                     MlpBlockConfig* config) {
  bool ok = true;
  if (b->activation().empty()) b->set_activation("gelu");
  absl::StatusOr<Activation> act = ActivationFromName(b->activation());
  if (act.ok()) {
    config->activation = *act;
  } else {
    p->Add(path + ".activation",
           absl::StrCat("must be one of ",
                        QuotedList({"relu", "gelu", "gelu_tanh", "swiglu"}),
                        ", got ", Quote(b->activation())));
    ok = false;
  }
  if (b->norm().empty()) b->set_norm("none");
  absl::StatusOr<NormType> norm = NormTypeFromName(b->norm());
  if (norm.ok()) {
    config->norm = *norm;
  } else {
    p->Add(path + ".norm",
           absl::StrCat("must be one of ",
                        QuotedList({"none", "layernorm", "rmsnorm"}), ", got ",
                        Quote(b->norm())));
    ok = false;
  }
  if (!b->has_bias()) b->set_bias(true);
  if (b->residual() && b->in_features() > 0 && b->out_features() > 0 &&
      b->in_features() != b->out_features()) {
    p->Add(path + ".residual",
           absl::StrCat("needs in_features == out_features, got ",
                        b->in_features(), " and ", b->out_features()));
    ok = false;
  }
  return ok;
}

// Every block in order; true when all are valid.
bool CheckBlocks(const DataInfo& data, Problems* p, JobPlan* plan) {
  trainyard::v1::ModelSpec* model = plan->spec.mutable_model();
  bool blocks_ok = true;
  if (model->blocks_size() == 0) {
    p->Add("model.blocks", "must have at least one block");
    blocks_ok = false;
  }
  int64_t prev_out = plan->feature_dim;  // 0 = unknown
  for (int i = 0; i < model->blocks_size(); ++i) {
    BlockSpec* b = model->mutable_blocks(i);
    const std::string path = absl::StrCat("model.blocks[", i, "]");
    MlpBlockConfig c;
    const bool widths_ok =
        CheckBlockWidths(path, i, prev_out, data.train_reported, b, p);
    const bool kinds_ok = CheckBlockKinds(path, b, p, &c);
    c.in_features = b->in_features();
    c.out_features = b->out_features();
    c.ffn_hidden_size = b->ffn_hidden_size();
    c.bias = b->bias();
    c.residual = b->residual();
    plan->blocks.push_back(c);
    blocks_ok = blocks_ok && widths_ok && kinds_ok;
    prev_out = b->out_features() > 0 ? b->out_features() : 0;
  }
  return blocks_ok;
}

// The last block's output against data.train's targets, where known.
void CheckOutputWidth(const DataInfo& data, const trainyard::v1::ModelSpec& m,
                      Problems* p) {
  const int num_blocks = m.blocks_size();
  if (num_blocks == 0 || !data.train.known || data.train.target_width <= 0) {
    return;
  }
  const int64_t out = m.blocks(num_blocks - 1).out_features();
  if (out > 0 && out != data.train.target_width) {
    p->Add(absl::StrCat("model.blocks[", num_blocks - 1, "].out_features"),
           absl::StrCat("must equal ",
                        data.train.class_targets
                            ? "the number of classes of data.train ("
                            : "the width K of data.train's targets (",
                        data.train.target_width, "), got ", out));
  }
}

// model.init: its seed (default: the spec's) and its safetensors file.
void CheckInit(const PlanOptions& options, Problems* p,
               trainyard::v1::JobSpec* s) {
  trainyard::v1::InitSpec* init = s->mutable_model()->mutable_init();
  if (init->seed() == 0) init->set_seed(s->seed());
  if (init->safetensors().empty()) return;
  const std::string written = init->safetensors();
  init->set_safetensors(ResolvePath(options.base_dir, written));
  const size_t problems = p->size();
  CheckConfined(p, "model.init.safetensors", written, init->safetensors(),
                options);
  if (options.check_files && p->size() == problems) {
    std::string problem = FileProblem(written, init->safetensors());
    if (!problem.empty()) p->Add("model.init.safetensors", problem);
  }
}

}  // namespace

bool CheckModel(const DataInfo& data, const PlanOptions& options, Problems* p,
                JobPlan* plan) {
  const bool blocks_ok = CheckBlocks(data, p, plan);
  const trainyard::v1::ModelSpec& model = plan->spec.model();
  const int num_blocks = model.blocks_size();
  CheckOutputWidth(data, model, p);
  if (plan->feature_dim == 0 && num_blocks > 0) {
    plan->feature_dim = model.blocks(0).in_features();  // files not checked
  }
  plan->output_dim =
      num_blocks > 0 ? model.blocks(num_blocks - 1).out_features() : 0;
  CheckInit(options, p, &plan->spec);
  return blocks_ok;
}

}  // namespace trainyard
