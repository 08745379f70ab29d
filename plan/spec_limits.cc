#include "plan/spec_limits.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "google/protobuf/struct.pb.h"
#include "plan/job_plan.h"

namespace trainyard {
namespace {

using trainyard::v1::DataSource;
using trainyard::v1::JobSpec;

int StructDepth(const google::protobuf::Value& v);

// Nesting depth of a Struct (1 for a flat one).
int StructDepth(const google::protobuf::Struct& s) {
  int depth = 0;
  for (const auto& [k, v] : s.fields()) depth = std::max(depth, StructDepth(v));
  return depth + 1;
}

int StructDepth(const google::protobuf::Value& v) {
  if (v.has_struct_value()) return StructDepth(v.struct_value());
  if (v.has_list_value()) {
    int depth = 0;
    for (const auto& e : v.list_value().values()) {
      depth = std::max(depth, StructDepth(e));
    }
    return depth + 1;
  }
  return 0;
}

void CheckLength(const std::string& path, const std::string& v, size_t limit,
                 Problems* p) {
  if (v.size() > limit) {
    p->Add(path, absl::StrCat(v.size(), " bytes, limit ", limit));
  }
}

void CheckSourceLengths(const std::string& path, const DataSource& d,
                        Problems* p) {
  CheckLength(path + ".npy.features", d.npy().features(), kMaxPathBytes, p);
  CheckLength(path + ".npy.targets", d.npy().targets(), kMaxPathBytes, p);
  CheckLength(path + ".synthetic.kind", d.synthetic().kind(), kMaxNameBytes, p);
  const auto& shards = d.npy_shards();
  for (const auto& [name, list] : {std::pair{".features", &shards.features()},
                                   std::pair{".targets", &shards.targets()}}) {
    const std::string field = path + ".npy_shards" + name;
    if (list->size() > kMaxListEntries) {
      p->Add(field,
             absl::StrCat(list->size(), " entries, limit ", kMaxListEntries));
    }
    for (int i = 0; i < std::min(list->size(), kMaxListEntries); ++i) {
      CheckLength(absl::StrCat(field, "[", i, "]"), list->Get(i), kMaxPathBytes,
                  p);
    }
  }
}

// The names and paths outside the lists.
void CheckFieldLengths(const JobSpec& s, Problems* p) {
  CheckLength("name", s.name(), kMaxNameBytes, p);
  CheckLength("task.plugin", s.task().plugin(), kMaxNameBytes, p);
  CheckLength("device", s.device(), kMaxNameBytes, p);
  CheckLength("precision", s.precision(), kMaxNameBytes, p);
  CheckLength("parallelism.schedule", s.parallelism().schedule(), kMaxNameBytes,
              p);
  CheckLength("optimizer.type", s.optimizer().type(), kMaxNameBytes, p);
  CheckLength("optimizer.decay_mask", s.optimizer().decay_mask(), kMaxNameBytes,
              p);
  CheckLength("optimizer.schedule.type", s.optimizer().schedule().type(),
              kMaxNameBytes, p);
  CheckLength("checkpoint.dir", s.checkpoint().dir(), kMaxPathBytes, p);
  CheckLength("kind", s.kind(), kMaxNameBytes, p);
  CheckLength("inference.checkpoint_dir", s.inference().checkpoint_dir(),
              kMaxPathBytes, p);
  CheckLength("inference.output_dir", s.inference().output_dir(), kMaxPathBytes,
              p);
  CheckLength("checkpoint.resume", s.checkpoint().resume(), kMaxNameBytes, p);
  CheckLength("model.init.safetensors", s.model().init().safetensors(),
              kMaxPathBytes, p);
  CheckSourceLengths("data.train", s.data().train(), p);
  CheckSourceLengths("data.eval", s.data().eval(), p);
}

// The blocks, parallelism.split and optimizer.no_decay: their entry counts
// and the strings in the first kMaxBlocks / kMaxListEntries entries.
void CheckListSizes(const JobSpec& s, Problems* p) {
  if (s.model().blocks_size() > kMaxBlocks) {
    p->Add("model.blocks", absl::StrCat(s.model().blocks_size(),
                                        " blocks, limit ", kMaxBlocks));
  }
  for (int i = 0; i < std::min(s.model().blocks_size(), kMaxBlocks); ++i) {
    const auto& b = s.model().blocks(i);
    CheckLength(absl::StrCat("model.blocks[", i, "].activation"),
                b.activation(), kMaxNameBytes, p);
    CheckLength(absl::StrCat("model.blocks[", i, "].norm"), b.norm(),
                kMaxNameBytes, p);
  }
  if (s.parallelism().split_size() > kMaxListEntries) {
    p->Add("parallelism.split",
           absl::StrCat(s.parallelism().split_size(), " entries, limit ",
                        kMaxListEntries));
  }
  if (s.optimizer().no_decay_size() > kMaxListEntries) {
    p->Add("optimizer.no_decay",
           absl::StrCat(s.optimizer().no_decay_size(), " entries, limit ",
                        kMaxListEntries));
  }
  for (int i = 0; i < std::min(s.optimizer().no_decay_size(), kMaxListEntries);
       ++i) {
    CheckLength(absl::StrCat("optimizer.no_decay[", i, "]"),
                s.optimizer().no_decay(i), kMaxNameBytes, p);
  }
}

void CheckTaskConfigSize(const JobSpec& s, Problems* p) {
  const size_t config_bytes = s.task().config().ByteSizeLong();
  if (config_bytes > kMaxTaskConfigBytes) {
    p->Add("task.config",
           absl::StrCat(config_bytes, " bytes serialized, limit ",
                        kMaxTaskConfigBytes));
  } else if (StructDepth(s.task().config()) > kMaxTaskConfigDepth) {
    p->Add("task.config",
           absl::StrCat("nested ", StructDepth(s.task().config()),
                        " levels deep, limit ", kMaxTaskConfigDepth));
  }
}

}  // namespace

void CheckSizeLimits(const JobSpec& spec, Problems* p) {
  const size_t bytes = spec.ByteSizeLong();
  if (bytes > kMaxSpecBytes) {
    p->Add("(spec)",
           absl::StrCat(bytes, " bytes serialized, limit ", kMaxSpecBytes));
  }
  CheckFieldLengths(spec, p);
  CheckListSizes(spec, p);
  CheckTaskConfigSize(spec, p);
}

}  // namespace trainyard
