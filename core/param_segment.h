// ParamSegment: one parameter tensor inside a stage's flat parameter buffer
// (and, at the same offsets, its gradient and optimizer-state buffers). The
// CPU optimizer, the fused GPU optimizer kernels and the checkpoint code all
// walk the same list.
#ifndef TRAINYARD_CORE_PARAM_SEGMENT_H_
#define TRAINYARD_CORE_PARAM_SEGMENT_H_

#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace trainyard {

struct ParamSegment {
  std::string name;  // "blocks.3.fc1.weight"
  Shape shape;
  int64_t offset = 0;  // elements into the flat buffer
  bool decay = true;   // weight decay applies
  int64_t size() const { return NumElements(shape); }
  // This parameter's view of a flat [total] buffer laid out like the
  // parameters (parameters, gradients, optimizer state, their copies).
  Tensor Of(const Tensor& flat) const {
    return flat.Rows(offset, offset + size()).View(shape);
  }
};

}  // namespace trainyard

#endif  // TRAINYARD_CORE_PARAM_SEGMENT_H_
