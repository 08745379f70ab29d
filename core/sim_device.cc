#include "core/sim_device.h"

#include <map>
#include <mutex>

#include "glog/logging.h"

namespace trainyard {
namespace {

class SimDeviceAllocator final : public Allocator {
 public:
  explicit SimDeviceAllocator(int index) : index_(index) {}
  Device device() const override { return Device::Sim(index_); }
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    return HostAllocator()->Allocate(bytes);
  }
  void Deallocate(void* ptr) override { HostAllocator()->Deallocate(ptr); }
  void EmptyCache() override { HostAllocator()->EmptyCache(); }

 private:
  const int index_;
};

}  // namespace

Allocator* SimAllocator(int index) {
  static std::mutex mu;
  static auto* const allocators = new std::map<int, Allocator*>();
  std::lock_guard<std::mutex> lock(mu);
  Allocator*& a = (*allocators)[index];
  if (a == nullptr) a = new SimDeviceAllocator(index);
  return a;
}

Tensor SimDeviceAccess::HostView(const Tensor& t) {
  CHECK(t.device().is_sim() || !t.defined())
      << "HostView of a tensor on " << t.device().ToString();
  return t.Relabeled(Device::Cpu());
}

Tensor SimDeviceAccess::Adopt(const Tensor& host, Device device) {
  CHECK(host.device().is_cpu() && device.is_sim())
      << "Adopt of a tensor on " << host.device().ToString() << " as "
      << device.ToString();
  return host.Relabeled(device);
}

}  // namespace trainyard
