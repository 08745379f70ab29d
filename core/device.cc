#include "core/device.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace trainyard {

std::string Device::ToString() const {
  return is_cpu() ? std::string("cpu") : absl::StrCat(KindName(), ":", index);
}

const char* Device::KindName() const {
  switch (kind) {
    case Kind::kCpu:
      return "cpu";
    case Kind::kCuda:
      return "cuda";
    case Kind::kSim:
      return "sim";
  }
  return "?";
}

absl::StatusOr<Device> ParseDevice(absl::string_view text,
                                   bool allow_bare_cuda) {
  if (text == "cpu") return Device::Cpu();
  if (text == "cuda" && allow_bare_cuda) return Device::Cuda(0);
  if (text == "sim" && allow_bare_cuda) return Device::Sim(0);
  for (Device::Kind kind : {Device::Kind::kCuda, Device::Kind::kSim}) {
    const std::string prefix = absl::StrCat(Device{kind, 0}.KindName(), ":");
    if (!absl::StartsWith(text, prefix)) continue;
    absl::string_view digits = text.substr(prefix.size());
    int32_t index = -1;
    const bool all_digits =
        !digits.empty() && digits.size() <= 4 &&
        digits.find_first_not_of("0123456789") == absl::string_view::npos;
    if (all_digits && absl::SimpleAtoi(digits, &index) && index <= 1023) {
      return Device{kind, index};
    }
  }
  std::string shown(text.substr(0, 64));
  if (text.size() > 64) shown += "...";
  return absl::InvalidArgumentError(absl::StrCat(
      "device \"", shown,
      "\": expected \"cpu\" or \"cuda:N\" (N = 0, 1, ...; \"sim:N\" for the "
      "simulated device)",
      text == "cuda" ? "; name the GPU, e.g. \"cuda:0\"" : ""));
}

}  // namespace trainyard
