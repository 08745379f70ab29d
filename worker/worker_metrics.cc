#include "worker/worker_metrics.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cuda/device_allocator.h"

namespace trainyard {

void StageMetrics::Record(const StepReport& r, double seconds,
                          const Transport* transport) {
  steps_.Increment();
  step_seconds_.Observe(seconds);
  const double times[kNumPhases] = {
      r.times.forward,   r.times.backward, r.times.comm,     r.times.idle,
      r.times.optimizer, r.times.loss,     r.times.data_wait};
  for (int i = 0; i < kNumPhases; ++i) phases_[i]->Increment(times[i]);
  device_.copies[0]->Increment(static_cast<double>(r.traffic.h2d_copies));
  device_.copies[1]->Increment(static_cast<double>(r.traffic.d2h_copies));
  device_.bytes[0]->Increment(static_cast<double>(r.traffic.h2d_bytes));
  device_.bytes[1]->Increment(static_cast<double>(r.traffic.d2h_bytes));
  device_.syncs->Increment(static_cast<double>(r.traffic.syncs));
  bubble_.Set(seconds > 0 ? std::min(1.0, r.times.idle / seconds) : 0.0);
  if (transport != nullptr) {
    const int64_t sent = transport->payload_bytes_sent();
    const int64_t received = transport->payload_bytes_received();
    bytes_sent_.Increment(static_cast<double>(sent - sent_before_));
    bytes_received_.Increment(static_cast<double>(received - received_before_));
    sent_before_ = sent;
    received_before_ = received;
  }
}

absl::StatusOr<std::unique_ptr<WorkerMetrics>> WorkerMetrics::Start(
    const std::string& listen, const Device& device,
    std::function<bool()> busy) {
  ASSIGN_OR_RETURN(std::unique_ptr<MetricsEndpoint> endpoint,
                   MetricsEndpoint::Start(listen));
  std::unique_ptr<WorkerMetrics> metrics(
      new WorkerMetrics(std::move(endpoint)));
  metrics->AddCollector(device, std::move(busy));
  return metrics;
}

// The families are registered in this order (the exposition's).
WorkerMetrics::WorkerMetrics(std::unique_ptr<MetricsEndpoint> endpoint)
    : endpoint_(std::move(endpoint)) {
  prometheus::Registry& r = endpoint_->registry();
  RegisterStepFamilies(r);
  RegisterDeviceFamilies(r);
  RegisterStateFamilies(r);
}

void WorkerMetrics::RegisterStepFamilies(prometheus::Registry& r) {
  steps_ = &prometheus::BuildCounter()
                .Name("trainyard_worker_steps_total")
                .Help("Steps this worker's stages completed.")
                .Register(r);
  step_seconds_ = &prometheus::BuildHistogram()
                       .Name("trainyard_worker_step_seconds")
                       .Help("Wall time of one step of this worker's stage.")
                       .Register(r);
  phase_seconds_ =
      &prometheus::BuildCounter()
           .Name("trainyard_worker_phase_seconds_total")
           .Help(
               "Seconds spent per phase of the steps (forward, backward, "
               "comm, idle = waiting for a neighbour, optimizer, loss, "
               "data_wait = the first stage waiting for its rows); "
               "device time on a GPU.")
           .Register(r);
}

void WorkerMetrics::RegisterDeviceFamilies(prometheus::Registry& r) {
  device_copies_ =
      &prometheus::BuildCounter()
           .Name("trainyard_worker_device_copies_total")
           .Help(
               "Copies between host and device made by this worker's "
               "stages (direction to_device or to_host); 0 on the CPU.")
           .Register(r);
  device_copy_bytes_ = &prometheus::BuildCounter()
                            .Name("trainyard_worker_device_copy_bytes_total")
                            .Help("Bytes of those copies, by direction.")
                            .Register(r);
  device_syncs_ =
      &prometheus::BuildCounter()
           .Name("trainyard_worker_device_syncs_total")
           .Help(
               "Times this worker's stages waited for their device inside "
               "steps (one per step on a GPU job that keeps its step on "
               "the device).")
           .Register(r);
}

void WorkerMetrics::RegisterStateFamilies(prometheus::Registry& r) {
  bubble_ = &prometheus::BuildGauge()
                 .Name("trainyard_worker_bubble_fraction")
                 .Help(
                     "Idle share of the last step's wall time (the "
                     "pipeline bubble as measured).")
                 .Register(r);
  checkpoint_seconds_ =
      &prometheus::BuildHistogram()
           .Name("trainyard_worker_checkpoint_write_seconds")
           .Help(
               "Seconds to write one stage's checkpoint file (in the "
               "background).")
           .Register(r)
           .Add({}, prometheus::Histogram::BucketBoundaries{
                        0.001, 0.01, 0.1, 0.5, 1, 2, 5, 10, 30, 60});
  payload_bytes_ =
      &prometheus::BuildCounter()
           .Name("trainyard_worker_payload_bytes_total")
           .Help(
               "Tensor bytes this worker's stages sent to and received "
               "from their neighbours over TCP (NCCL traffic is not "
               "counted).")
           .Register(r);
  snapshots_kept_ = &prometheus::BuildCounter()
                         .Name("trainyard_worker_snapshots_total")
                         .Help(
                             "In-memory snapshots kept (own stage's, or a "
                             "neighbour's copy).")
                         .Register(r);
}

void WorkerMetrics::AddCollector(const Device& device,
                                 std::function<bool()> busy) {
  endpoint_->AddCollector([device, busy = std::move(busy)] {
    LabeledValues busy_values;
    busy_values.push_back({{}, busy() ? 1.0 : 0.0});
    std::vector<prometheus::MetricFamily> out;
    out.push_back(GaugeFamily("trainyard_worker_busy",
                              "1 while this worker runs a stage.",
                              busy_values));
    if (device.is_cuda()) {
      absl::StatusOr<gpu::DeviceAllocator*> allocator =
          gpu::DeviceAllocator::ForDevice(device.index);
      if (allocator.ok()) {
        const gpu::AllocatorStats st = (*allocator)->stats();
        out.push_back(GaugeFamily(
            "trainyard_worker_device_memory_bytes",
            "GPU memory of this worker's caching allocator: in_use (live "
            "blocks), cached (free blocks kept), peak (most in use).",
            {{{{"kind", "in_use"}}, static_cast<double>(st.bytes_in_use)},
             {{{"kind", "cached"}}, static_cast<double>(st.bytes_cached)},
             {{{"kind", "peak"}}, static_cast<double>(st.peak_bytes_in_use)}}));
      }
    }
    return out;
  });
}

std::unique_ptr<StageMetrics> WorkerMetrics::OfStage(int stage) {
  const std::string k = absl::StrCat(stage);
  std::array<prometheus::Counter*, StageMetrics::kNumPhases> phases;
  for (int i = 0; i < StageMetrics::kNumPhases; ++i) {
    phases[i] = &phase_seconds_->Add(
        {{"stage", k}, {"phase", StageMetrics::kPhases[i]}});
  }
  StageMetrics::DeviceCounters device;
  const char* directions[2] = {"to_device", "to_host"};
  for (int i = 0; i < 2; ++i) {
    device.copies[i] =
        &device_copies_->Add({{"stage", k}, {"direction", directions[i]}});
    device.bytes[i] =
        &device_copy_bytes_->Add({{"stage", k}, {"direction", directions[i]}});
  }
  device.syncs = &device_syncs_->Add({{"stage", k}});
  return std::make_unique<StageMetrics>(
      steps_->Add({{"stage", k}}),
      step_seconds_->Add({{"stage", k}},
                         prometheus::Histogram::BucketBoundaries{
                             0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2,
                             0.5, 1, 2, 5, 10, 30}),
      phases, bubble_->Add({{"stage", k}}),
      payload_bytes_->Add({{"stage", k}, {"direction", "sent"}}),
      payload_bytes_->Add({{"stage", k}, {"direction", "received"}}), device);
}

void WorkerMetrics::SnapshotKept(bool own) {
  snapshots_kept_->Add({{"kind", own ? "own" : "copy"}}).Increment();
}

void WorkerMetrics::CheckpointWritten(double seconds) {
  checkpoint_seconds_->Observe(seconds);
}

}  // namespace trainyard
