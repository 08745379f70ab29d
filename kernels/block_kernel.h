// BlockKernel: one MLP block (kernels/mlp_block.h's formulas and parameter
// layout) on one device — the interface the pipeline stage runs, with a
// CPU implementation (MlpBlock: OpenBLAS and our fused loops) and a CUDA
// one (gpu::CudaMlpBlock: cuBLASLt and our kernels) behind it.
//
// Tensors: parameters and their gradients are float32 views on the
// context's device (one flat buffer per stage); activations x, y, d_out,
// dx are on that device in the context's activation dtype (float32, or
// bfloat16 for precision bf16). The contract of each call is MlpBlock's:
// BackwardInput stashes what BackwardWeight needs in the BlockSaved of its
// microbatch; BackwardWeight accumulates into (or, with accumulate=false,
// overwrites) the gradients and releases the saved tensors.
//
// Work is queued on the context's stream; nothing waits. Not thread-safe:
// one kernel object per block per stage.
#ifndef TRAINYARD_KERNELS_BLOCK_KERNEL_H_
#define TRAINYARD_KERNELS_BLOCK_KERNEL_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/tensor.h"
#include "kernels/exec_context.h"
#include "kernels/mlp_block.h"

namespace trainyard {

// What Forward keeps of one microbatch for the backward passes; its
// contents belong to the implementation.
class BlockSaved {
 public:
  virtual ~BlockSaved() = default;
};

class BlockKernel {
 public:
  virtual ~BlockKernel() = default;
  virtual const MlpBlockConfig& config() const = 0;

  // *y [b, out] = block(x [b, in]). With `saved` null nothing is kept
  // (eval); otherwise *saved receives what the backward passes need.
  virtual absl::Status Forward(const MlpBlockParams& params, const Tensor& x,
                               Tensor* y,
                               std::unique_ptr<BlockSaved>* saved) = 0;
  // *dx [b, in] from d_out [b, out]; dx may be null (first block of the
  // model).
  virtual absl::Status BackwardInput(const MlpBlockParams& params,
                                     const Tensor& d_out, BlockSaved* saved,
                                     Tensor* dx) = 0;
  // grads (+)= dL/dparams of the microbatch in `saved`.
  virtual absl::Status BackwardWeight(BlockSaved* saved, bool accumulate,
                                      MlpBlockParams* grads) = 0;
  // BackwardWeight for several microbatches in order, the first with
  // `accumulate`, the others accumulating: the same bits as one call each.
  // The CPU blocks chain them (MlpBlock::BackwardWeights); the default
  // calls BackwardWeight for each.
  virtual absl::Status BackwardWeights(absl::Span<BlockSaved* const> saved,
                                       bool accumulate, MlpBlockParams* grads);

  // Bracket a run of passes over parameters that do not change in between
  // (a training step's forward and backward passes, an eval pass, an
  // inference run) that read each weight up to `weight_reads` times (a
  // training step: each microbatch's forward and input gradient, which a
  // first stage's first block may skip; an eval or inference run: each
  // microbatch's forward): in between, the kernel may keep what it derives
  // from the parameters from one pass to the next (the CPU blocks keep
  // their weights packed for the packed GEMM, kernels/packed_gemm.h, when
  // more than one GEMM reads them). Results are bitwise the same with and
  // without the calls; the parameters must not change between them.
  virtual void BeginPasses(int weight_reads) {}
  virtual void EndPasses() {}
};

// Tests only: with `keep` false, CPU blocks pack their weights in every
// GEMM instead of keeping the first forward GEMM's packs (BeginPasses); the
// same bits. Process-wide; read at each BeginPasses.
void KeepPackedWeightsForTesting(bool keep);

// The block for `config` on ctx's device. `ctx` must outlive it. Errors:
// the config is invalid, or the device cannot run it (built without CUDA,
// no such GPU).
absl::StatusOr<std::unique_ptr<BlockKernel>> CreateBlockKernel(
    const MlpBlockConfig& config, const ExecContext* ctx);

}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_BLOCK_KERNEL_H_
