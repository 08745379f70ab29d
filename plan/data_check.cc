#include "plan/data_check.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "core/npy.h"
#include "core/npy_shards.h"
#include "core/tensor.h"
#include "plan/spec_paths.h"

namespace trainyard {
namespace {

using trainyard::v1::DataSource;
using trainyard::v1::DataSpec;
using trainyard::v1::NpySource;
using trainyard::v1::SyntheticSource;

std::string DescribeArray(const NpyHeader& h) {
  return absl::StrCat(DTypeName(h.dtype), " ", ShapeToString(h.shape));
}

// Both files named, made absolute and inside the data folder; false (with
// the problems added) when they may not be opened.
bool ResolveNpyPaths(const std::string& path, const PlanOptions& options,
                     NpySource* npy, Problems* p) {
  bool ok = true;
  if (npy->features().empty()) {
    p->Add(path + ".features", "required");
    ok = false;
  }
  if (npy->targets().empty()) {
    p->Add(path + ".targets", "required");
    ok = false;
  }
  if (!ok) return false;
  const std::string features_written = npy->features();
  const std::string targets_written = npy->targets();
  npy->set_features(ResolvePath(options.base_dir, features_written));
  npy->set_targets(ResolvePath(options.base_dir, targets_written));
  const size_t problems = p->size();
  CheckConfined(p, path + ".features", features_written, npy->features(),
                options);
  CheckConfined(p, path + ".targets", targets_written, npy->targets(), options);
  return p->size() == problems;  // otherwise never opened
}

// The header of the .npy file at `abs`; a problem for `field` when it is
// missing or unreadable.
absl::StatusOr<NpyHeader> ReadHeader(const std::string& field,
                                     const std::string& written,
                                     const std::string& abs, Problems* p) {
  std::string problem = FileProblem(written, abs);
  if (!problem.empty()) {
    p->Add(field, problem);
    return absl::NotFoundError(problem);
  }
  absl::StatusOr<NpyHeader> h = ReadNpyHeader(abs);
  if (!h.ok()) p->Add(field, std::string(h.status().message()));
  return h;
}

// Features must be float32 [N, D] with N, D >= 1.
bool CheckFeaturesArray(const std::string& field, const std::string& written,
                        const NpyHeader& h, Problems* p) {
  if (h.dtype != DType::kFloat32 || h.shape.size() != 2) {
    p->Add(field, absl::StrCat(written, ": must be float32 [N, D], got ",
                               DescribeArray(h)));
    return false;
  }
  if (h.shape[0] < 1 || h.shape[1] < 1) {
    p->Add(field, absl::StrCat(written, ": must have N >= 1 rows and ",
                               "D >= 1 columns, got ", ShapeToString(h.shape)));
    return false;
  }
  return true;
}

// Targets must be class ids, int32/int64 [N], or float32 [N, K].
bool CheckTargetsArray(const std::string& field, const std::string& written,
                       const NpyHeader& h, Problems* p, bool* class_targets) {
  const bool ints = h.dtype == DType::kInt32 || h.dtype == DType::kInt64;
  if (ints && h.shape.size() == 1) {
    *class_targets = true;
    return true;
  }
  if (h.dtype == DType::kFloat32 && h.shape.size() == 2 && h.shape[1] >= 1) {
    *class_targets = false;
    return true;
  }
  p->Add(field, absl::StrCat(written,
                             ": must be int32/int64 [N] (class ids) or float32 "
                             "[N, K] (K >= 1), got ",
                             DescribeArray(h)));
  return false;
}

void CheckNpySource(const std::string& path, NpySource* npy,
                    const PlanOptions& options, Problems* p, SourceInfo* info) {
  const std::string features_written = npy->features();
  const std::string targets_written = npy->targets();
  if (!ResolveNpyPaths(path, options, npy, p)) return;
  if (!options.check_files) return;
  const std::string features_field = path + ".features";
  const std::string targets_field = path + ".targets";
  absl::StatusOr<NpyHeader> fh =
      ReadHeader(features_field, features_written, npy->features(), p);
  absl::StatusOr<NpyHeader> th =
      ReadHeader(targets_field, targets_written, npy->targets(), p);
  bool ok = true;
  if (fh.ok()) {
    ok = CheckFeaturesArray(features_field, features_written, *fh, p);
  }
  bool class_targets = false;
  if (th.ok()) {
    ok = CheckTargetsArray(targets_field, targets_written, *th, p,
                           &class_targets) &&
         ok;
  }
  if (!fh.ok() || !th.ok() || !ok) return;
  if (th->shape[0] != fh->shape[0]) {
    p->Add(targets_field,
           absl::StrCat(targets_written, ": has ", th->shape[0],
                        " rows but features have ", fh->shape[0]));
    return;
  }
  info->known = true;
  info->rows = fh->shape[0];
  info->features = fh->shape[1];
  info->class_targets = class_targets;
  info->target_width = class_targets ? 0 : th->shape[1];
  info->bytes =
      static_cast<uint64_t>(NumElements(fh->shape)) * 4 +
      static_cast<uint64_t>(NumElements(th->shape)) * DTypeSize(th->dtype);
}

// Each entry of `list` (data.<x>.npy_shards.features or .targets) made
// absolute and kept inside the data folder; with options.check_files, the
// files it names, in order (a problem when an entry names none).
bool ResolveShardList(const std::string& field,
                      google::protobuf::RepeatedPtrField<std::string>* list,
                      const PlanOptions& options, Problems* p,
                      std::vector<std::string>* files) {
  if (list->empty()) {
    p->Add(field, "required: at least one file or glob pattern");
    return false;
  }
  bool ok = true;
  for (int i = 0; i < list->size(); ++i) {
    const std::string entry_field = absl::StrCat(field, "[", i, "]");
    const std::string written = list->Get(i);
    *list->Mutable(i) = ResolvePath(options.base_dir, written);
    const size_t before = p->size();
    CheckConfined(p, entry_field, written, list->Get(i), options);
    if (p->size() != before) {
      ok = false;
      continue;
    }
    if (!options.check_files) continue;
    absl::StatusOr<std::vector<std::string>> matched = ExpandGlob(list->Get(i));
    if (!matched.ok()) {
      p->Add(entry_field, absl::StrCat(Quote(written), ": ",
                                       absl::IsNotFound(matched.status())
                                           ? "names no file"
                                           : matched.status().message()));
      ok = false;
      continue;
    }
    for (const std::string& file : *matched) {
      CheckConfined(p, entry_field, file, file, options);
      files->push_back(file);
    }
    ok = ok && p->size() == before;
  }
  return ok;
}

void CheckNpyShardsSource(const std::string& path,
                          trainyard::v1::NpyShardsSource* shards,
                          const PlanOptions& options, Problems* p,
                          SourceInfo* info) {
  std::vector<std::string> features, targets;
  bool ok = ResolveShardList(path + ".features", shards->mutable_features(),
                             options, p, &features);
  ok = ResolveShardList(path + ".targets", shards->mutable_targets(), options,
                        p, &targets) &&
       ok;
  // "": float32 or float16, as the headers say; numpy cannot name bfloat16.
  ok = CheckOneOf(p, path + ".features_dtype", shards->features_dtype(),
                  {"", "bfloat16"}) &&
       ok;
  if (!ok || !options.check_files) return;
  if (features.size() != targets.size()) {
    p->Add(path, absl::StrCat("features name ", features.size(),
                              " files but targets name ", targets.size(),
                              ": the k-th of each are a pair"));
    return;
  }
  NpyShardsOptions open_options;
  open_options.bfloat16_features = shards->features_dtype() == "bfloat16";
  absl::StatusOr<std::shared_ptr<const NpyShards>> opened =
      NpyShards::Open(features, targets, open_options);
  if (!opened.ok()) {
    p->Add(path, std::string(opened.status().message()));
    return;
  }
  const NpyShards& source = **opened;
  info->known = true;
  info->rows = source.num_rows();
  info->features = source.num_features();
  info->class_targets = source.target_width() == 0;
  info->target_width = source.target_width();
  info->bytes = 0;  // streamed from the files, not held in memory
}

// The generator's kind and each size in its range.
bool CheckSyntheticFields(const std::string& path, const SyntheticSource& syn,
                          Problems* p) {
  bool ok = CheckOneOf(p, path + ".kind", syn.kind(),
                       {"teacher_regression", "gaussian_blobs"});
  if (syn.num_samples() < 1) {
    p->Add(path + ".num_samples",
           absl::StrCat("must be > 0, got ", syn.num_samples()));
    ok = false;
  } else if (syn.num_samples() > (int64_t{1} << 36)) {
    p->Add(path + ".num_samples",
           absl::StrCat("must be <= 2^36, got ", syn.num_samples()));
    ok = false;
  }
  if (syn.num_features() < 1 || syn.num_features() > kMaxWidth) {
    p->Add(path + ".num_features", absl::StrCat("must be in [1, ", kMaxWidth,
                                                "], got ", syn.num_features()));
    ok = false;
  }
  const bool blobs = syn.kind() == "gaussian_blobs";
  const int64_t min_outputs = blobs ? 2 : 1;
  if (syn.num_outputs() < min_outputs || syn.num_outputs() > kMaxWidth) {
    p->Add(path + ".num_outputs",
           absl::StrCat("must be in [", min_outputs, ", ", kMaxWidth, "]",
                        blobs ? " (number of classes)" : "", ", got ",
                        syn.num_outputs()));
    ok = false;
  }
  if (!std::isfinite(syn.noise()) || syn.noise() < 0) {
    p->Add(path + ".noise", absl::StrCat("must be >= 0 and finite, got ",
                                         FormatDouble(syn.noise())));
    ok = false;
  }
  return ok;
}

// The generator's own limits (engine/dataset.cc): the rows it draws and the
// per-class centers (gaussian_blobs) or teacher weights must stay below 2^30
// values each, so a valid plan never fails to load.
bool CheckGeneratorLimits(const std::string& path, const SyntheticSource& syn,
                          Problems* p) {
  bool ok = true;
  constexpr double kMaxValues = static_cast<double>(int64_t{1} << 30);
  const double width =
      static_cast<double>(std::max(syn.num_features(), syn.num_outputs()));
  if (static_cast<double>(syn.num_samples()) * width > kMaxValues) {
    p->Add(path + ".num_samples",
           absl::StrCat("num_samples * max(num_features, num_outputs) must "
                        "be <= 2^30, got ",
                        syn.num_samples() *
                            std::max(syn.num_features(), syn.num_outputs())));
    ok = false;
  }
  if (static_cast<double>(syn.num_outputs()) * syn.num_features() >
      kMaxValues) {
    p->Add(path + ".num_outputs",
           absl::StrCat("num_outputs * num_features must be <= 2^30, got ",
                        syn.num_outputs() * syn.num_features()));
    ok = false;
  }
  return ok;
}

void CheckSyntheticSource(const std::string& path, SyntheticSource* syn,
                          uint64_t data_seed, Problems* p, SourceInfo* info) {
  bool ok = CheckSyntheticFields(path, *syn, p);
  if (ok) ok = CheckGeneratorLimits(path, *syn, p);
  if (syn->seed() == 0) syn->set_seed(data_seed);
  if (!ok) return;
  const bool blobs = syn->kind() == "gaussian_blobs";
  info->known = true;
  info->rows = syn->num_samples();
  info->features = syn->num_features();
  info->class_targets = blobs;
  info->target_width = syn->num_outputs();
  const uint64_t n = static_cast<uint64_t>(info->rows);
  info->bytes =
      n * static_cast<uint64_t>(info->features) * 4 +
      (blobs ? n * 8 : n * static_cast<uint64_t>(info->target_width) * 4);
}

void CheckSource(const std::string& path, DataSource* source,
                 uint64_t data_seed, const PlanOptions& options, Problems* p,
                 SourceInfo* info) {
  switch (source->source_case()) {
    case DataSource::kNpy:
      CheckNpySource(path + ".npy", source->mutable_npy(), options, p, info);
      break;
    case DataSource::kSynthetic:
      CheckSyntheticSource(path + ".synthetic", source->mutable_synthetic(),
                           data_seed, p, info);
      break;
    case DataSource::kNpyShards:
      CheckNpyShardsSource(path + ".npy_shards", source->mutable_npy_shards(),
                           options, p, info);
      break;
    default:
      p->Add(path, "needs a source: npy, npy_shards or synthetic");
  }
}

// data.eval's features and targets must be data.train's kind and width.
void CheckEvalMatchesTrain(const DataSpec& data, const SourceInfo& train,
                           const SourceInfo& eval, Problems* p) {
  const std::string epath = data.eval().has_npy() ? "data.eval.npy"
                            : data.eval().has_npy_shards()
                                ? "data.eval.npy_shards"
                                : "data.eval.synthetic";
  if (eval.features != train.features) {
    p->Add(epath,
           absl::StrCat("has ", eval.features, " features but data.train has ",
                        train.features));
  }
  if (eval.class_targets != train.class_targets) {
    p->Add(epath,
           absl::StrCat("targets are ",
                        eval.class_targets ? "class ids" : "float values",
                        " but data.train's are ",
                        train.class_targets ? "class ids" : "float values"));
  } else if (!eval.class_targets && eval.target_width != train.target_width) {
    p->Add(epath, absl::StrCat("targets have width ", eval.target_width,
                               " but data.train's have ", train.target_width));
  } else if (eval.class_targets && eval.target_width > 0 &&
             train.target_width > 0 &&
             eval.target_width != train.target_width) {
    // Known only for synthetic sources (.npy labels are not read).
    p->Add(epath,
           absl::StrCat("has ", eval.target_width,
                        " classes but data.train has ", train.target_width));
  }
}

// Without data.eval: data.eval_fraction in [0, 1), holding out at least one
// row and keeping at least one.
void CheckEvalFraction(const DataSpec& data, const SourceInfo& train,
                       Problems* p) {
  const double f = data.eval_fraction();
  if (!(f >= 0 && f < 1)) {
    p->Add("data.eval_fraction",
           absl::StrCat("must be in [0, 1), got ", FormatDouble(f)));
  } else if (f > 0 && train.known) {
    const int64_t held =
        static_cast<int64_t>(std::floor(static_cast<double>(train.rows) * f));
    if (held < 1 || held >= train.rows) {
      p->Add("data.eval_fraction",
             absl::StrCat("holds out ", held, " of data.train's ", train.rows,
                          " rows; need at least 1 eval and 1 train row"));
    }
  }
}

void CheckBatchAndEvalEvery(const DataSpec& data, Problems* p) {
  const bool has_eval_data = data.has_eval() || data.eval_fraction() > 0;
  if (data.batch_size() <= 0) {
    p->Add("data.batch_size",
           absl::StrCat("must be > 0, got ", data.batch_size()));
  }
  if (data.eval_every() < 0) {
    p->Add("data.eval_every",
           absl::StrCat("must be >= 0, got ", data.eval_every()));
  } else if (data.eval_every() > 0 && !has_eval_data) {
    p->Add("data.eval_every",
           "needs eval data: data.eval or data.eval_fraction > 0");
  }
}

}  // namespace

DataInfo CheckData(const PlanOptions& options, Problems* p, JobPlan* plan) {
  DataSpec* data = plan->spec.mutable_data();
  if (data->seed() == 0) data->set_seed(plan->spec.seed());
  DataInfo info;
  const size_t problems_before_train = p->size();
  if (!data->has_train()) {
    p->Add("data.train", "required (npy, npy_shards or synthetic)");
  } else {
    CheckSource("data.train", data->mutable_train(), data->seed(), options, p,
                &info.train);
  }
  info.train_reported = p->size() > problems_before_train;
  if (data->has_eval()) {
    CheckSource("data.eval", data->mutable_eval(), data->seed(), options, p,
                &info.eval);
    if (info.train.known && info.eval.known) {
      CheckEvalMatchesTrain(*data, info.train, info.eval, p);
    }
    if (data->eval_fraction() != 0) {
      p->Add("data.eval_fraction",
             absl::StrCat("must be 0 when data.eval is given, got ",
                          FormatDouble(data->eval_fraction())));
    }
  } else {
    CheckEvalFraction(*data, info.train, p);
  }
  CheckBatchAndEvalEvery(*data, p);
  plan->feature_dim = info.train.known ? info.train.features : 0;
  plan->class_targets = info.train.class_targets;
  plan->train_rows = info.train.known ? info.train.rows : 0;
  return info;
}

}  // namespace trainyard
