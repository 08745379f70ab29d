// DeviceTraffic: the host<->device copies and synchronisations an
// ExecContext counts, in a header of its own so that step reports can carry
// them without the execution context.
#ifndef TRAINYARD_KERNELS_DEVICE_TRAFFIC_H_
#define TRAINYARD_KERNELS_DEVICE_TRAFFIC_H_

#include <cstdint>

namespace trainyard {

// Host<->device copies and synchronisations of a device context since it
// was created (all zero on the CPU). Subtract two readings for a span.
struct DeviceTraffic {
  int64_t h2d_copies = 0;
  int64_t h2d_bytes = 0;
  int64_t d2h_copies = 0;
  int64_t d2h_bytes = 0;
  int64_t syncs = 0;  // waits of the host for the device

  DeviceTraffic operator-(const DeviceTraffic& o) const {
    return {h2d_copies - o.h2d_copies, h2d_bytes - o.h2d_bytes,
            d2h_copies - o.d2h_copies, d2h_bytes - o.d2h_bytes,
            syncs - o.syncs};
  }
};

}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_DEVICE_TRAFFIC_H_
