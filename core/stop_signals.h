// Clean shutdown of the daemons on SIGTERM / SIGINT.
//
// BlockStopSignals() must run in main before any other thread starts (gRPC
// and our pools inherit the mask), so that only WaitForStopSignal sees the
// signals. Thread-safe after that.
#ifndef TRAINYARD_CORE_STOP_SIGNALS_H_
#define TRAINYARD_CORE_STOP_SIGNALS_H_

#include <signal.h>

namespace trainyard {

// Blocks SIGTERM and SIGINT in the calling thread and returns that set.
sigset_t BlockStopSignals();

// Waits until SIGTERM or SIGINT arrives; returns the signal number.
int WaitForStopSignal(const sigset_t& signals);

}  // namespace trainyard

#endif  // TRAINYARD_CORE_STOP_SIGNALS_H_
