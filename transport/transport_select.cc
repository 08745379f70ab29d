#include "transport/transport_select.h"

#include <cstdint>
#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/device.h"

namespace trainyard {
namespace {

// -1 for "cpu", N for "cuda:N".
absl::StatusOr<int> GpuIndex(int stage, const std::string& device) {
  absl::StatusOr<Device> d = ParseDevice(device);
  if (!d.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transport choice: stage ", stage, " ", d.status().message()));
  }
  return d->is_cpu() ? -1 : d->index;
}

// Each stage's GPU index (-1: cpu) once its host and device are checked;
// *sim_stages gets the stages on a simulated device.
absl::StatusOr<std::vector<int>> StageGpus(
    const std::vector<StagePlacement>& stages,
    std::vector<size_t>* sim_stages) {
  std::vector<int> gpu(stages.size());
  for (size_t s = 0; s < stages.size(); ++s) {
    if (stages[s].host.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("transport choice: stage ", s, " has an empty host"));
    }
    absl::StatusOr<int> index = GpuIndex(static_cast<int>(s), stages[s].device);
    if (!index.ok()) return index.status();
    gpu[s] = *index;
    if (ParseDevice(stages[s].device)->is_sim()) sim_stages->push_back(s);
  }
  return gpu;
}

// "stage 2 is" or "stages 1, 3 are".
std::string StagesAre(const std::vector<size_t>& stages) {
  return absl::StrCat(stages.size() == 1 ? "stage " : "stages ",
                      absl::StrJoin(stages, ", "),
                      stages.size() == 1 ? " is" : " are");
}

// For stages all on GPUs: "stages 0 and 2 share cuda:0 on host h" for the
// first pair that shares one, which rules NCCL out; "" when none does.
std::string SharedGpu(const std::vector<StagePlacement>& stages,
                      const std::vector<int>& gpu) {
  std::map<std::pair<std::string, int>, size_t> first_user;
  for (size_t s = 0; s < stages.size(); ++s) {
    auto [it, inserted] =
        first_user.emplace(std::make_pair(stages[s].host, gpu[s]), s);
    if (!inserted) {
      return absl::StrCat("stages ", it->second, " and ", s, " share ",
                          stages[s].device, " on host ", stages[s].host);
    }
  }
  return "";
}

}  // namespace

const char* TransportKindName(TransportKind kind) {
  switch (kind) {
    case TransportKind::kNone:
      return "none";
    case TransportKind::kTcp:
      return "tcp";
    case TransportKind::kNccl:
      return "nccl";
  }
  return "?";
}

absl::StatusOr<TransportChoice> ChooseTransport(
    const std::vector<StagePlacement>& stages, bool nccl_built) {
  if (stages.empty()) {
    return absl::InvalidArgumentError(
        "transport choice: the job has no stages");
  }
  std::vector<size_t> sim_stages;
  absl::StatusOr<std::vector<int>> gpu = StageGpus(stages, &sim_stages);
  if (!gpu.ok()) return gpu.status();

  TransportChoice choice;
  if (stages.size() == 1) {
    choice.kind = TransportKind::kNone;
    choice.reason = absl::StrCat("one stage on ", stages[0].device, " on host ",
                                 stages[0].host, ": no transport needed");
    return choice;
  }

  std::vector<size_t> cpu_stages;
  for (size_t s = 0; s < stages.size(); ++s) {
    if ((*gpu)[s] < 0) cpu_stages.push_back(s);
  }
  choice.kind = TransportKind::kTcp;
  if (cpu_stages.size() == stages.size()) {
    choice.reason = "every stage is on cpu: using TCP";
    return choice;
  }
  choice.host_staging = true;
  const std::string tcp = "using TCP with host staging";
  if (!sim_stages.empty()) {
    choice.reason =
        absl::StrCat(StagesAre(sim_stages), " on a simulated device: ", tcp);
    return choice;
  }
  if (!cpu_stages.empty()) {
    choice.reason = absl::StrCat(StagesAre(cpu_stages), " on cpu: ", tcp);
    return choice;
  }
  if (const std::string shared = SharedGpu(stages, *gpu); !shared.empty()) {
    choice.reason = absl::StrCat(shared, ": ", tcp);
    return choice;
  }
  if (!nccl_built) {
    choice.reason = absl::StrCat(
        "every stage is on a distinct GPU but this build has no NCCL: ", tcp);
    return choice;
  }
  choice.kind = TransportKind::kNccl;
  choice.host_staging = false;
  choice.reason = absl::StrCat("all ", stages.size(),
                               " stages are on distinct GPUs: using NCCL");
  return choice;
}

}  // namespace trainyard
