#include "schedule/schedule_timeline.h"

#include <cctype>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// A small XML well-formedness check: one root element, tags nested and
// matched, attributes named and quoted, '&' only in the five predefined or
// numeric entities, '<' only opening markup. Enough to catch what a
// renderer gets wrong (an unescaped name, an unclosed element). Returns ""
// or the first problem.
class XmlChecker {
 public:
  explicit XmlChecker(const std::string& doc) : d_(doc) {}

  std::string Check() {
    if (d_.compare(0, 5, "<?xml") == 0) {
      const size_t end = d_.find("?>");
      if (end == std::string::npos) return "unterminated XML declaration";
      i_ = end + 2;
    }
    int roots = 0;
    std::vector<std::string> open;
    while (i_ < d_.size()) {
      if (d_[i_] != '<') {
        if (open.empty() && !std::isspace(static_cast<unsigned char>(d_[i_]))) {
          return Where("text outside the root element");
        }
        if (std::string e = Char(); !e.empty()) return e;
        continue;
      }
      if (d_.compare(i_, 4, "<!--") == 0) {
        const size_t end = d_.find("-->", i_);
        if (end == std::string::npos) return Where("unterminated comment");
        i_ = end + 3;
        continue;
      }
      if (d_.compare(i_, 2, "</") == 0) {
        i_ += 2;
        const std::string name = Name();
        if (open.empty() || open.back() != name) {
          return Where("</" + name + "> does not close the open element");
        }
        open.pop_back();
        SkipSpace();
        if (i_ >= d_.size() || d_[i_] != '>') return Where("expected '>'");
        ++i_;
        continue;
      }
      ++i_;
      const std::string name = Name();
      if (name.empty()) return Where("element without a name");
      if (open.empty() && roots++ > 0) return Where("second root element");
      if (std::string e = TagRest(name, &open); !e.empty()) return e;
    }
    if (!open.empty()) return "unclosed <" + open.back() + ">";
    if (roots != 1) return "no root element";
    return "";
  }

 private:
  // The attributes and end of a start tag whose name was read: "/>" closes
  // the element at once, ">" leaves it open. "" or the first problem.
  std::string TagRest(const std::string& name, std::vector<std::string>* open) {
    while (true) {
      SkipSpace();
      if (i_ >= d_.size()) return "unterminated tag <" + name;
      if (d_.compare(i_, 2, "/>") == 0) {
        i_ += 2;
        break;
      }
      if (d_[i_] == '>') {
        ++i_;
        open->push_back(name);
        break;
      }
      const std::string attr = Name();
      if (attr.empty()) return Where("bad attribute in <" + name);
      SkipSpace();
      if (i_ >= d_.size() || d_[i_] != '=') return Where("expected '='");
      ++i_;
      SkipSpace();
      if (i_ >= d_.size() || (d_[i_] != '"' && d_[i_] != '\'')) {
        return Where("unquoted attribute " + attr);
      }
      const char quote = d_[i_++];
      while (i_ < d_.size() && d_[i_] != quote) {
        if (d_[i_] == '<') return Where("'<' in attribute " + attr);
        if (std::string e = Char(); !e.empty()) return e;
      }
      if (i_ >= d_.size()) return "unterminated attribute " + attr;
      ++i_;
    }
    return "";
  }

  std::string Where(const std::string& what) {
    return what + " at offset " + std::to_string(i_);
  }
  void SkipSpace() {
    while (i_ < d_.size() && std::isspace(static_cast<unsigned char>(d_[i_]))) {
      ++i_;
    }
  }
  std::string Name() {
    const size_t start = i_;
    while (i_ < d_.size() &&
           (std::isalnum(static_cast<unsigned char>(d_[i_])) || d_[i_] == '_' ||
            d_[i_] == ':' || d_[i_] == '-' || d_[i_] == '.')) {
      ++i_;
    }
    return d_.substr(start, i_ - start);
  }
  // One character of text or attribute value, or one entity.
  std::string Char() {
    if (d_[i_] != '&') {
      ++i_;
      return "";
    }
    const size_t end = d_.find(';', i_);
    if (end == std::string::npos) return Where("'&' without ';'");
    const std::string entity = d_.substr(i_ + 1, end - i_ - 1);
    if (entity != "amp" && entity != "lt" && entity != "gt" &&
        entity != "quot" && entity != "apos" &&
        (entity.size() < 2 || entity[0] != '#')) {
      return Where("unknown entity &" + entity + ";");
    }
    i_ = end + 1;
    return "";
  }

  const std::string& d_;
  size_t i_ = 0;
};

TEST(XmlCheckerTest, CatchesWhatItShould) {
  EXPECT_EQ(XmlChecker("<a x=\"1\"><b/>t &amp; u</a>").Check(), "");
  EXPECT_THAT(XmlChecker("<a><b></a>").Check(), HasSubstr("does not close"));
  EXPECT_THAT(XmlChecker("<a>x &b; y</a>").Check(),
              HasSubstr("unknown entity &b;"));
  EXPECT_THAT(XmlChecker("<a>x & y</a>").Check(), HasSubstr("without ';'"));
  EXPECT_THAT(XmlChecker("<a x=1/>").Check(), HasSubstr("unquoted"));
  EXPECT_THAT(XmlChecker("<a/><b/>").Check(), HasSubstr("second root"));
  EXPECT_THAT(XmlChecker("<a>").Check(), HasSubstr("unclosed <a>"));
}

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

TEST(ScheduleTimelineTest, LabelsShrinkToTheirCell) {
  const Action f31{ActionKind::kForward, 3, 1};
  EXPECT_EQ(TimelineLabel(f31, 4), "f3.1");  // odd chunk: lower case
  EXPECT_EQ(TimelineLabel(f31, 3), "f3");
  EXPECT_EQ(TimelineLabel(f31, 1), "f");
  EXPECT_EQ(TimelineLabel(f31, 0), "");
  EXPECT_EQ(TimelineLabel({ActionKind::kBackwardWeight, 12, 0}, 3), "W12");
  EXPECT_EQ(TimelineLabel({ActionKind::kBackwardInput, 12, 2}, 5), "B12.2");
}

TEST(ScheduleTimelineTest, OneFOneBOnTwoStages) {
  // Stage 1 runs F0 B0 W0 on [1, 4); stage 0 waits for B0's gradient.
  Schedule s = MakeOneFOneBSchedule(2, 1);
  ScheduleSimulation sim = *SimulateSchedule(s);
  EXPECT_EQ(RenderTextTimeline(s, sim, 10),
            "1f1b: 2 stages, 1 microbatches; 1 column = 0.5 time units, "
            "step 5\n"
            "stage 0  |F0....B0W0|\n"
            "stage 1  |..F0B0W0..|\n");
  // Narrower: one column per time unit, letters only.
  EXPECT_THAT(Lines(RenderTextTimeline(s, sim, 5)),
              ::testing::ElementsAre(HasSubstr("1 column = 1 time units"),
                                     "stage 0  |F..BW|", "stage 1  |.FBW.|"));
}

TEST(ScheduleTimelineTest, ZeroBubbleVFitsAboutAHundredColumns) {
  Schedule s = *MakeZeroBubbleVSchedule(4, 8);
  ScheduleSimulation sim = *SimulateSchedule(s);
  // 51 half-unit passes of step: two columns each.
  std::vector<std::string> lines = Lines(RenderTextTimeline(s, sim, 120));
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_THAT(lines[0], HasSubstr("1 column = 0.25 time units, step 25.5"));
  EXPECT_THAT(lines[1], StartsWith("stage 0  |F0F1F2F3......f0b0f1b1"));
  EXPECT_THAT(lines[4], StartsWith("stage 3  |......F0f0F1f1"));
  for (size_t i = 1; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i].size(), 10u + 102 + 1) << lines[i];
  }
}

TEST(ScheduleTimelineTest, UnevenCostsAreScaledToTheWidth) {
  Schedule s = MakeOneFOneBSchedule(4, 8);
  ScheduleSimulation sim = *SimulateSchedule(s, PassCosts{1, 1.3, 0.7});
  std::vector<std::string> lines = Lines(RenderTextTimeline(s, sim, 90));
  ASSERT_EQ(lines.size(), 5u);
  for (size_t i = 1; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i].size(), 10u + 90 + 1) << lines[i];
  }
  EXPECT_THAT(lines[4], StartsWith("stage 3  |...."));  // waits for F0
}

TEST(ScheduleTimelineTest, SvgIsWellFormedAndHasABoxPerPass) {
  for (const char* name : {"gpipe", "1f1b", "zbh1", "interleaved", "zbv"}) {
    Schedule s = *MakeTrainingSchedule(name, 4, 8, 0);
    ScheduleSimulation sim = *SimulateSchedule(s);
    const std::string svg = RenderSvgTimeline(s, sim);
    EXPECT_EQ(XmlChecker(svg).Check(), "") << name;
    EXPECT_THAT(svg, StartsWith("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                                "<svg xmlns=\"http://www.w3.org/2000/svg\""));
    size_t boxes = 0;
    for (size_t at = svg.find("<title>stage "); at != std::string::npos;
         at = svg.find("<title>stage ", at + 1)) {
      ++boxes;
    }
    EXPECT_EQ(boxes, 4u * 8 * 3 * s.num_chunks) << name;
    EXPECT_THAT(svg, HasSubstr("bubble"));
  }
  Schedule zbv = *MakeZeroBubbleVSchedule(4, 8);
  const std::string svg = RenderSvgTimeline(zbv, *SimulateSchedule(zbv));
  EXPECT_THAT(svg,
              HasSubstr("<title>stage 0 F0.1 (forward): 3.5 to 4</title>"));
  EXPECT_THAT(svg, HasSubstr("fill=\"#a0cbe8\""));  // a chunk-1 forward
  EXPECT_THAT(svg, HasSubstr("bubble 0.0588 of the step, 0.0625 of compute"));
}

TEST(ScheduleTimelineTest, SvgEscapesTheScheduleName) {
  Schedule s = MakeGPipeSchedule(1, 1);
  s.name = "a<b & \"c\"";
  const std::string svg = RenderSvgTimeline(s, *SimulateSchedule(s));
  EXPECT_EQ(XmlChecker(svg).Check(), "");
  EXPECT_THAT(svg, HasSubstr("a&lt;b &amp; &quot;c&quot;"));
}

}  // namespace
}  // namespace trainyard
