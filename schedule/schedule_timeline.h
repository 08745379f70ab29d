// Drawing a simulated pipeline schedule (schedule/schedule.h SimulateSchedule):
// a text timeline for a terminal and the same timeline as an SVG image.
// Pure functions of their inputs; no I/O. docs/SCHEDULES.md shows examples.
#ifndef TRAINYARD_SCHEDULE_SCHEDULE_TIMELINE_H_
#define TRAINYARD_SCHEDULE_SCHEDULE_TIMELINE_H_

#include <string>

#include "schedule/schedule.h"

namespace trainyard {

// The label of a compute pass in a timeline cell of `width` characters:
// ActionToString's "F3.1" when it fits, else "F3", else "F". The letter is
// lower case on odd chunks ("f3.1"), so even a one-character cell tells
// chunk 1 of a V (the way back up) from chunk 0.
std::string TimelineLabel(const Action& pass, int width);

// One row per stage, "stage 0 |F0F1F2..|": each pass drawn as its label cut
// to its width, then blanks; '.' where the stage is idle. Time runs left to
// right in equal columns: when every pass starts and ends on a multiple of
// the shortest pass (unit costs do), each such quantum gets the same whole
// number of columns, as many as fit in `max_columns`; otherwise the step is
// scaled to `max_columns` and a pass covers the columns whose middle it
// covers. The first line says what one column is worth.
std::string RenderTextTimeline(const Schedule& schedule,
                               const ScheduleSimulation& simulation,
                               int max_columns = 120);

// A standalone SVG document (UTF-8, well-formed XML): one row of boxes per
// stage, coloured by pass kind (forward blue, input gradient orange, weight
// gradient green; lighter on odd chunks), labelled where the label fits and
// titled (hover text) always, with the bubble under the rows.
std::string RenderSvgTimeline(const Schedule& schedule,
                              const ScheduleSimulation& simulation);

}  // namespace trainyard

#endif  // TRAINYARD_SCHEDULE_SCHEDULE_TIMELINE_H_
