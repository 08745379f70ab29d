#include "schedule/schedule_timeline.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace trainyard {
namespace {

// x is a whole multiple of q (up to rounding in the simulation's sums).
bool IsMultiple(double x, double q) {
  const double n = x / q;
  return std::fabs(n - std::round(n)) < 1e-6;
}

std::string XmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string Header(const Schedule& sched) {
  std::string chunks;
  if (sched.num_chunks > 1) {
    chunks = absl::StrCat(", ", sched.num_chunks, " chunks per stage (",
                          sched.layout == ChunkLayout::kV ? "V" : "loop", ")");
  }
  return absl::StrCat(sched.name, ": ", sched.num_stages, " stages, ",
                      sched.num_microbatches, " microbatches", chunks);
}

// Where the SVG timeline draws: the plot's left edge and top, each stage's
// row and box heights, the plot's width, and pixels per time unit.
constexpr double kSvgPlotWidth = 960;
struct SvgLayout {
  double px;
  double left = 70, top = 36, row_h = 28, box_h = 22, plot_w = kSvgPlotWidth;
};

// The fill of a pass's box: its kind's colour, lighter on odd chunks.
const char* SvgFill(const Action& a) {
  const bool odd = a.chunk % 2 == 1;
  if (odd) {
    return a.kind == ActionKind::kForward         ? "#a0cbe8"
           : a.kind == ActionKind::kBackwardInput ? "#ffbe7d"
                                                  : "#8cd17d";
  }
  if (a.kind == ActionKind::kBackwardInput) return "#f28e2b";
  if (a.kind == ActionKind::kBackwardWeight) return "#59a14f";
  return "#4e79a7";  // forward
}

// One pass of stage `s`: its box with hover text, and its label when one
// fits.
void AppendSvgPass(const SvgLayout& g, int s, const TimedAction& p,
                   std::string* out) {
  const double y = g.top + s * g.row_h;
  const double x = g.left + p.start * g.px;
  const double w = (p.end - p.start) * g.px;
  const std::string name = ActionToString(p.action);
  absl::StrAppendFormat(
      out,
      "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.0f\" "
      "fill=\"%s\" stroke=\"white\" stroke-width=\"0.5\">"
      "<title>stage %d %s (%s): %g to %g</title></rect>\n",
      x, y, w, g.box_h, SvgFill(p.action), s, XmlEscape(name),
      ActionKindName(p.action.kind), p.start, p.end);
  // About 7 px per character at font-size 11.
  const std::string label =
      TimelineLabel(p.action, static_cast<int>((w - 2) / 7));
  if (!label.empty()) {
    const bool odd = p.action.chunk % 2 == 1;
    absl::StrAppendFormat(out,
                          "<text x=\"%.2f\" y=\"%.1f\" "
                          "text-anchor=\"middle\" fill=\"%s\">%s</text>\n",
                          x + w / 2, y + g.box_h - 7, odd ? "black" : "white",
                          XmlEscape(label));
  }
}

}  // namespace

std::string TimelineLabel(const Action& pass, int width) {
  std::string full = ActionToString(pass);
  if (pass.chunk % 2 == 1) full[0] = std::tolower(full[0]);
  const std::string candidates[] = {full, full.substr(0, full.find('.')),
                                    full.substr(0, 1)};
  for (const std::string& c : candidates) {
    if (static_cast<int>(c.size()) <= width) return c;
  }
  return "";
}

std::string RenderTextTimeline(const Schedule& sched,
                               const ScheduleSimulation& sim, int max_columns) {
  max_columns = std::max(max_columns, 1);
  const double T = sim.makespan;
  if (T <= 0) return "(empty step)\n";
  // The quantum: the shortest pass, if every pass is aligned to it.
  double q = T;
  for (const auto& row : sim.timeline) {
    for (const TimedAction& p : row) {
      if (p.end > p.start) q = std::min(q, p.end - p.start);
    }
  }
  bool aligned = IsMultiple(T, q);
  for (const auto& row : sim.timeline) {
    for (const TimedAction& p : row) {
      aligned = aligned && IsMultiple(p.start, q) && IsMultiple(p.end, q);
    }
  }
  double column;  // time units per column
  if (aligned && std::round(T / q) <= max_columns) {
    const int per_quantum =
        std::max(1, static_cast<int>(max_columns / std::round(T / q)));
    column = q / per_quantum;
  } else {
    column = T / max_columns;
  }
  const int columns =
      std::max(1, static_cast<int>(std::ceil(T / column - 1e-6)));
  std::string out = absl::StrFormat("%s; 1 column = %g time units, step %g\n",
                                    Header(sched), column, T);
  for (size_t s = 0; s < sim.timeline.size(); ++s) {
    std::string row(columns, '.');
    for (const TimedAction& p : sim.timeline[s]) {
      if (!IsComputePass(p.action.kind) || p.end <= p.start) continue;
      // The columns whose middle the pass covers.
      const int c0 = static_cast<int>(std::round(p.start / column));
      const int c1 =
          std::min(columns, static_cast<int>(std::round(p.end / column)));
      if (c1 <= c0) continue;
      const std::string label = TimelineLabel(p.action, c1 - c0);
      for (int c = c0; c < c1; ++c) {
        const size_t i = c - c0;
        row[c] = i < label.size() ? label[i] : ' ';
      }
    }
    absl::StrAppendFormat(&out, "stage %-2d |%s|\n", s, row);
  }
  return out;
}

std::string RenderSvgTimeline(const Schedule& sched,
                              const ScheduleSimulation& sim) {
  const int S = static_cast<int>(sim.timeline.size());
  const double T = sim.makespan > 0 ? sim.makespan : 1;
  const SvgLayout g{/*px=*/kSvgPlotWidth / T};
  const double width = g.left + g.plot_w + 20;
  const double height = g.top + S * g.row_h + 56;
  std::string out = absl::StrFormat(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" "
      "height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" font-family=\"monospace\" "
      "font-size=\"11\">\n"
      "<title>%s</title>\n"
      "<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"white\"/>\n"
      "<text x=\"%.0f\" y=\"20\" font-size=\"13\">%s</text>\n",
      width, height, width, height, XmlEscape(Header(sched)), width, height,
      g.left, XmlEscape(Header(sched)));
  for (int s = 0; s < S; ++s) {
    const double y = g.top + s * g.row_h;
    absl::StrAppendFormat(&out,
                          "<text x=\"8\" y=\"%.1f\">stage %d</text>\n"
                          "<rect x=\"%.0f\" y=\"%.1f\" width=\"%.0f\" "
                          "height=\"%.0f\" fill=\"#eeeeee\"/>\n",
                          y + g.box_h - 6, s, g.left, y, g.plot_w, g.box_h);
    for (const TimedAction& p : sim.timeline[s]) {
      if (IsComputePass(p.action.kind)) AppendSvgPass(g, s, p, &out);
    }
  }
  const double y = g.top + S * g.row_h + 18;
  absl::StrAppendFormat(
      &out,
      "<text x=\"%.0f\" y=\"%.1f\">step %g time units; bubble %.4f of the "
      "step, %.4f of compute</text>\n"
      "<text x=\"%.0f\" y=\"%.1f\" fill=\"#555555\">forward blue, input "
      "gradient orange, weight gradient green; lighter: odd chunks; grey: "
      "idle</text>\n"
      "</svg>\n",
      g.left, y, sim.makespan, sim.bubble, sim.bubble_of_compute, g.left,
      y + 18);
  return out;
}

}  // namespace trainyard
