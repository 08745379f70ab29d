#include "engine/replica_group.h"

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/alltoallv.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "engine/gradient_tree.h"
#include "kernels/exec_context.h"

namespace trainyard {
namespace {

// Gloo's store over our Rendezvous (same write-once contract). Gloo
// reports store failures as exceptions; Join catches them.
class RendezvousStore final : public gloo::rendezvous::Store {
 public:
  RendezvousStore(Rendezvous* rendezvous, absl::Duration timeout)
      : rendezvous_(rendezvous), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    absl::Status st =
        rendezvous_->Put(key, std::string(data.begin(), data.end()));
    if (!st.ok()) throw gloo::IoException(std::string(st.message()));
  }

  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::string> v = rendezvous_->Get(key, timeout_);
    if (!v.ok()) throw gloo::IoException(std::string(v.status().message()));
    return std::vector<char>(v->begin(), v->end());
  }

  void wait(const std::vector<std::string>& keys) override {
    wait(keys, absl::ToChronoMilliseconds(timeout_));
  }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    for (const std::string& key : keys) {
      absl::StatusOr<std::string> v =
          rendezvous_->Get(key, absl::FromChrono(timeout));
      if (!v.ok()) throw gloo::IoException(std::string(v.status().message()));
    }
  }

 private:
  Rendezvous* const rendezvous_;
  const absl::Duration timeout_;
};

}  // namespace

ReplicaGroup::ReplicaGroup(ReplicaGroupOptions options,
                           std::shared_ptr<gloo::Context> context)
    : options_(std::move(options)), context_(std::move(context)) {}

ReplicaGroup::~ReplicaGroup() = default;

std::string ReplicaGroup::Name() const {
  return absl::StrCat("replica group ", options_.key_prefix, " (replica ",
                      options_.rank, " of ", options_.size, ")");
}

absl::StatusOr<std::unique_ptr<ReplicaGroup>> ReplicaGroup::Join(
    Rendezvous* rendezvous, const ReplicaGroupOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("replica group ", options.key_prefix, ": rank ",
                     options.rank, " of ", options.size));
  }
  if (options.size == 1) {
    return std::unique_ptr<ReplicaGroup>(new ReplicaGroup(options, nullptr));
  }
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    std::shared_ptr<gloo::transport::Device> device =
        gloo::transport::tcp::CreateDevice(attr);
    auto context =
        std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
    context->setTimeout(absl::ToChronoMilliseconds(options.timeout));
    RendezvousStore store(rendezvous, options.timeout);
    gloo::rendezvous::PrefixStore prefixed(options.key_prefix + "/gloo", store);
    context->connectFullMesh(prefixed, device);
    return std::unique_ptr<ReplicaGroup>(
        new ReplicaGroup(options, std::move(context)));
  } catch (const std::exception& e) {
    const std::string what = e.what();
    const std::string message = absl::StrCat(
        "replica group ", options.key_prefix, " (replica ", options.rank,
        " of ", options.size, "): joining failed: ", what.substr(0, 512));
    if (what.find("imed out") != std::string::npos ||
        what.find("deadline") != std::string::npos ||
        what.find("Deadline") != std::string::npos) {
      return absl::DeadlineExceededError(message);
    }
    return absl::UnavailableError(message);
  }
}

absl::Status ReplicaGroup::AllGatherBytes(const void* in, size_t bytes,
                                          char* out) {
  if (options_.size == 1) {
    std::memcpy(out, in, bytes);
    return absl::OkStatus();
  }
  try {
    gloo::AllgatherOptions opts(context_);
    opts.setInput(static_cast<char*>(const_cast<void*>(in)), bytes);
    opts.setOutput(out, bytes * options_.size);
    opts.setTag(next_tag_++);
    opts.setTimeout(absl::ToChronoMilliseconds(options_.timeout));
    gloo::allgather(opts);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        Name(), ": all-gather failed: ", std::string(e.what()).substr(0, 512)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<double>> ReplicaGroup::AllGather(
    const std::vector<double>& mine) {
  std::vector<double> all(mine.size() * options_.size);
  const absl::Status st =
      AllGatherBytes(mine.data(), mine.size() * sizeof(double),
                     reinterpret_cast<char*>(all.data()));
  if (!st.ok()) return st;
  return all;
}

absl::Status ReplicaGroup::SumInTreeOrder(Tensor* gradient) {
  if (gradient->dtype() != DType::kFloat32 || !gradient->device().is_cpu()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Name(), ": gradients must be float32 on the host"));
  }
  const int R = options_.size;
  if (R == 1) return absl::OkStatus();
  static const absl::StatusOr<std::unique_ptr<ExecContext>> host =
      ExecContext::Create(Device::Cpu(), Precision::kFp32);
  if (!host.ok()) return host.status();
  // Slice r is length[r] elements, after those of the slices before it
  // (the first n % R slices one longer).
  const int64_t n = gradient->numel();
  if (n == 0) return absl::OkStatus();
  std::vector<int64_t> length(R);
  for (int r = 0; r < R; ++r) length[r] = n / R + (r < n % R ? 1 : 0);
  const int me = options_.rank;
  const int64_t mine = length[me];
  if (copies_.numel() != R * mine) {
    copies_ = Tensor::Empty(DType::kFloat32, {R, mine});
    folded_ = Tensor::Empty(DType::kFloat32, {mine});
    tree_ = std::make_unique<GradientTree>(host->get(), mine);
  }
  RETURN_IF_ERROR(ExchangeSlices(gradient, length, mine));
  // The replicas' block sums of this slice, folded in replica order by the
  // same counter a single replica uses for its microbatches.
  if (mine > 0) RETURN_IF_ERROR(FoldSlices(mine));
  return GatherSums(gradient, length, mine);
}

absl::Status ReplicaGroup::ExchangeSlices(Tensor* gradient,
                                          const std::vector<int64_t>& length,
                                          int64_t mine) {
  const int R = options_.size;
  try {
    // Reduce-scatter's exchange: slice r of this replica's gradient to
    // replica r; row r of copies_ from replica r.
    gloo::AlltoallvOptions opts(context_);
    opts.setInput(gradient->data<float>(), length);
    opts.setOutput(copies_.data<float>(), std::vector<int64_t>(R, mine));
    opts.setTag(next_tag_++);
    opts.setTimeout(absl::ToChronoMilliseconds(options_.timeout));
    gloo::alltoallv(opts);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        Name(),
        ": gradient exchange failed: ", std::string(e.what()).substr(0, 512)));
  }
  return absl::OkStatus();
}

absl::Status ReplicaGroup::FoldSlices(int64_t mine) {
  for (int r = 0; r < options_.size; ++r) {
    RETURN_IF_ERROR(tree_->Add(copies_.Rows(r, r + 1).View({mine})));
  }
  return tree_->Finish(&folded_);
}

absl::Status ReplicaGroup::GatherSums(Tensor* gradient,
                                      const std::vector<int64_t>& length,
                                      int64_t mine) {
  try {
    gloo::AllgathervOptions opts(context_);
    opts.setInput(folded_.data<float>(), static_cast<size_t>(mine));
    opts.setOutput(gradient->data<float>(),
                   std::vector<size_t>(length.begin(), length.end()));
    opts.setTag(next_tag_++);
    opts.setTimeout(absl::ToChronoMilliseconds(options_.timeout));
    gloo::allgatherv(opts);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat(Name(), ": gathering the summed gradient failed: ",
                     std::string(e.what()).substr(0, 512)));
  }
  return absl::OkStatus();
}

}  // namespace trainyard
