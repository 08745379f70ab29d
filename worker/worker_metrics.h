// The worker's Prometheus metrics (docs/CONTROLLER.md, "Metrics"), served
// on --metrics_listen: per-stage steps, step and phase seconds, the bubble,
// payload bytes and host<->device traffic (StageMetrics, resolved once per
// assignment), checkpoint writes, snapshots kept, and gauges read at each
// scrape (busy, the GPU allocator's memory).
//
// Thread safety: WorkerMetrics may be used from any thread; a StageMetrics
// from one thread at a time (its stage's).
#ifndef TRAINYARD_WORKER_WORKER_METRICS_H_
#define TRAINYARD_WORKER_WORKER_METRICS_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/device.h"
#include "engine/stage.h"
#include "observability/prometheus_endpoint.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "transport/transport.h"

namespace trainyard {

// One stage's Prometheus metrics (the worker's families, labelled with the
// stage), resolved once so that a step only adds numbers.
class StageMetrics {
 public:
  static constexpr int kNumPhases = 7;  // kPhases below
  // A device stage's host<->device traffic: copies and bytes each way
  // ([0] to the device, [1] to the host) and synchronisations.
  struct DeviceCounters {
    std::array<prometheus::Counter*, 2> copies;
    std::array<prometheus::Counter*, 2> bytes;
    prometheus::Counter* syncs;
  };

  StageMetrics(prometheus::Counter& steps, prometheus::Histogram& step_seconds,
               std::array<prometheus::Counter*, kNumPhases> phases,
               prometheus::Gauge& bubble, prometheus::Counter& bytes_sent,
               prometheus::Counter& bytes_received, DeviceCounters device)
      : steps_(steps),
        step_seconds_(step_seconds),
        phases_(phases),
        bubble_(bubble),
        bytes_sent_(bytes_sent),
        bytes_received_(bytes_received),
        device_(device) {}

  // One step; `transport` (may be null) counts the bytes moved so far.
  void Record(const StepReport& r, double seconds, const Transport* transport);

  // The phase label of phases[i].
  static constexpr const char* kPhases[kNumPhases] = {
      "forward", "backward", "comm", "idle", "optimizer", "loss", "data_wait"};

 private:
  prometheus::Counter& steps_;
  prometheus::Histogram& step_seconds_;
  const std::array<prometheus::Counter*, kNumPhases> phases_;
  prometheus::Gauge& bubble_;
  prometheus::Counter& bytes_sent_;
  prometheus::Counter& bytes_received_;
  const DeviceCounters device_;
  int64_t sent_before_ = 0;
  int64_t received_before_ = 0;
};

class WorkerMetrics {
 public:
  // Serves /metrics on `listen` and registers the worker's families.
  // `busy` (called at every scrape) says whether a stage runs; a CUDA
  // `device`'s caching allocator is reported too. Errors:
  // MetricsEndpoint::Start's.
  static absl::StatusOr<std::unique_ptr<WorkerMetrics>> Start(
      const std::string& listen, const Device& device,
      std::function<bool()> busy);
  WorkerMetrics(const WorkerMetrics&) = delete;
  WorkerMetrics& operator=(const WorkerMetrics&) = delete;

  int port() const { return endpoint_->port(); }

  // The metrics of stage `stage` (labelled with it).
  std::unique_ptr<StageMetrics> OfStage(int stage);
  // An in-memory snapshot kept: the stage's own (`own`) or a neighbour's
  // copy.
  void SnapshotKept(bool own);
  // A stage's checkpoint file took `seconds` to write.
  void CheckpointWritten(double seconds);

 private:
  explicit WorkerMetrics(std::unique_ptr<MetricsEndpoint> endpoint);
  // Steps, step and phase seconds.
  void RegisterStepFamilies(prometheus::Registry& r);
  // Host<->device copies, their bytes, synchronisations.
  void RegisterDeviceFamilies(prometheus::Registry& r);
  // The bubble, checkpoint writes, payload bytes, snapshots kept.
  void RegisterStateFamilies(prometheus::Registry& r);
  void AddCollector(const Device& device, std::function<bool()> busy);

  // Owns the registry the families below live in.
  std::unique_ptr<MetricsEndpoint> endpoint_;
  prometheus::Family<prometheus::Counter>* steps_ = nullptr;
  prometheus::Family<prometheus::Histogram>* step_seconds_ = nullptr;
  prometheus::Family<prometheus::Counter>* phase_seconds_ = nullptr;
  prometheus::Family<prometheus::Gauge>* bubble_ = nullptr;
  prometheus::Histogram* checkpoint_seconds_ = nullptr;
  prometheus::Family<prometheus::Counter>* snapshots_kept_ = nullptr;
  prometheus::Family<prometheus::Counter>* payload_bytes_ = nullptr;
  prometheus::Family<prometheus::Counter>* device_copies_ = nullptr;
  prometheus::Family<prometheus::Counter>* device_copy_bytes_ = nullptr;
  prometheus::Family<prometheus::Counter>* device_syncs_ = nullptr;
};

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_WORKER_METRICS_H_
