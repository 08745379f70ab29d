// device.h without a CUDA toolkit: every call fails cleanly.
#include "kernels/cuda/no_cuda.h"
#include "kernels/cuda/runtime.h"

namespace trainyard {
namespace gpu {
absl::StatusOr<int> DeviceCount() { return NoCuda("DeviceCount"); }
absl::Status CheckDevice(int) { return NoCuda("CheckDevice"); }
absl::Status SetDevice(int) { return NoCuda("SetDevice"); }
absl::Status StreamSynchronize(Stream) { return NoCuda("StreamSynchronize"); }
absl::Status CopyHostToDevice(void*, const void*, size_t, Stream) {
  return NoCuda("CopyHostToDevice");
}
absl::Status CopyDeviceToHost(void*, const void*, size_t, Stream) {
  return NoCuda("CopyDeviceToHost");
}
absl::Status CopyDeviceToDevice(void*, const void*, size_t, Stream) {
  return NoCuda("CopyDeviceToDevice");
}
absl::Status MemsetAsync(void*, int, size_t, Stream) {
  return NoCuda("MemsetAsync");
}
absl::Status CopyHostToDeviceAsync(void*, const void*, size_t, Stream) {
  return NoCuda("CopyHostToDeviceAsync");
}
absl::Status CopyDeviceToHostAsync(void*, const void*, size_t, Stream) {
  return NoCuda("CopyDeviceToHostAsync");
}
absl::StatusOr<void*> AllocPinned(size_t) { return NoCuda("AllocPinned"); }
void FreePinned(void*) {}
absl::StatusOr<Stream> CreateStream(int) { return NoCuda("CreateStream"); }
absl::StatusOr<Event> CreateEvent() { return NoCuda("CreateEvent"); }
void DestroyEvent(Event) {}
absl::Status RecordEvent(Event, Stream) { return NoCuda("RecordEvent"); }
absl::StatusOr<float> ElapsedMs(Event, Event) { return NoCuda("ElapsedMs"); }
absl::StatusOr<MemoryInfo> GetMemoryInfo(int) {
  return NoCuda("GetMemoryInfo");
}

}  // namespace gpu
}  // namespace trainyard
