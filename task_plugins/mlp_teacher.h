// The frozen teacher of the logit_distillation plugin: an MLP read from a
// safetensors file, blocks.{i}.fc1.weight [fc1_out, in],
// blocks.{i}.fc2.weight [out, ffn], optional .fc1.bias / .fc2.bias and
// .norm.weight / .norm.bias, each block a kernels/mlp_block.h MlpBlock on
// the CPU in the style (activation, norm, residual) the config gives it.
// Not thread-safe; the plugin calls it from one thread at a time.
#ifndef TRAINYARD_TASK_PLUGINS_MLP_TEACHER_H_
#define TRAINYARD_TASK_PLUGINS_MLP_TEACHER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "kernels/mlp_block.h"

namespace trainyard {
namespace plugin {

// How one block is built, by the names ActivationFromName and
// NormTypeFromName take.
struct BlockStyle {
  std::string activation = "gelu";
  std::string norm = "none";
  bool residual = false;
};

// The style of each block: `common` for every block or, with per_block,
// blocks[i] for block i (then there must be one per block).
struct TeacherStyles {
  BlockStyle common;
  bool per_block = false;
  std::vector<BlockStyle> blocks;
};

class MlpTeacher {
 public:
  // Reads the teacher at `path` (the resolved path, named in errors) and
  // checks it against `styles`: each block's tensors must have the shapes
  // its style and fc1 / fc2 imply, consecutive blocks must chain, and every
  // tensor of the file must be used. InvalidArgument naming the tensor, or
  // the file's own error after "task.config.teacher: ".
  static absl::StatusOr<MlpTeacher> Load(const std::string& path,
                                         const TeacherStyles& styles);

  const std::string& path() const { return path_; }
  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  // The input features of blocks.0 and the outputs of the last block.
  int64_t in_features() const;
  int64_t out_features() const;

  // The teacher's logits [rows, out_features()] of `features` [rows,
  // in_features()], float32.
  absl::StatusOr<Tensor> Forward(const float* features, int64_t rows) const;

 private:
  struct Block {
    MlpBlock block;
    MlpBlockParams params;
  };

  std::string path_;
  std::vector<Block> blocks_;
};

}  // namespace plugin
}  // namespace trainyard

#endif  // TRAINYARD_TASK_PLUGINS_MLP_TEACHER_H_
