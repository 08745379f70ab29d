#include "controller/log_ring.h"

#include <atomic>
#include <string>

#include "gtest/gtest.h"

namespace trainyard {
namespace {

v1::LogLine Line(const std::string& text) {
  v1::LogLine l;
  l.set_stage(1);
  l.set_text(text);
  return l;
}

class CountingListener : public LogRing::Listener {
 public:
  void OnLogLines() override { ++calls; }
  std::atomic<int> calls{0};
};

TEST(LogRingTest, NumbersLinesDenselyFromZero) {
  LogRing ring;
  EXPECT_EQ(ring.Append(Line("a")), 0);
  EXPECT_EQ(ring.Append(Line("b")), 1);
  int64_t seq = 0;
  v1::LogLine out;
  ASSERT_TRUE(ring.Read(&seq, &out));
  EXPECT_EQ(out.text(), "a");
  seq = 1;
  ASSERT_TRUE(ring.Read(&seq, &out));
  EXPECT_EQ(out.seq(), 1);
  seq = 2;
  EXPECT_FALSE(ring.Read(&seq, &out));
}

TEST(LogRingTest, KeepsTheNewestLines) {
  LogRingLimits limits;
  limits.max_lines = 100;
  LogRing ring(limits);
  for (int i = 0; i < 1000; ++i) ring.Append(Line(std::to_string(i)));
  EXPECT_EQ(ring.lines(), 100u);
  // A reader asking for a line no longer held moves on to the oldest held.
  int64_t seq = 0;
  v1::LogLine out;
  ASSERT_TRUE(ring.Read(&seq, &out));
  EXPECT_EQ(seq, 900);
  EXPECT_EQ(out.text(), "900");
  EXPECT_EQ(ring.state().end, 1000);
}

TEST(LogRingTest, KeepsItsTextWithinTheByteLimit) {
  LogRingLimits limits;
  limits.max_bytes = 10000;
  LogRing ring(limits);
  for (int i = 0; i < 500; ++i) {
    ring.Append(Line(std::string(900, 'x')));
    EXPECT_LE(ring.bytes(), limits.max_bytes);
  }
  EXPECT_EQ(ring.lines(), 11u);  // 11 * 900 <= 10000 < 12 * 900
}

TEST(LogRingTest, CutsLongLinesAtACharacterBoundary) {
  LogRingLimits limits;
  limits.max_line_bytes = 1024;
  LogRing ring(limits);
  // 1023 ASCII bytes, then a 3-byte character that would straddle the cut.
  ring.Append(Line(std::string(1023, 'a') + "\xE2\x82\xAC" + "tail"));
  int64_t seq = 0;
  v1::LogLine out;
  ASSERT_TRUE(ring.Read(&seq, &out));
  EXPECT_EQ(out.text(), std::string(1023, 'a'));
  EXPECT_EQ(CutUtf8("\xE2\x82\xAC\xE2\x82\xAC", 5), "\xE2\x82\xAC");
  EXPECT_EQ(CutUtf8("short", 1024), "short");
}

TEST(LogRingTest, ClosedRingTakesNoLinesAndTellsListeners) {
  LogRing ring;
  auto listener = std::make_shared<CountingListener>();
  LogRing::Snapshot snap = ring.Subscribe(listener);
  EXPECT_FALSE(snap.closed);
  ring.Append(Line("a"));
  EXPECT_EQ(listener->calls, 1);
  ring.Close();
  EXPECT_EQ(listener->calls, 2);
  EXPECT_TRUE(ring.state().closed);
  EXPECT_EQ(ring.Append(Line("late")), -1);
  EXPECT_EQ(ring.lines(), 1u);
}

TEST(LogRingTest, ADestroyedListenerIsForgotten) {
  LogRing ring;
  auto listener = std::make_shared<CountingListener>();
  ring.Subscribe(listener);
  listener.reset();
  ring.Append(Line("a"));  // must not touch the dead listener
  EXPECT_EQ(ring.lines(), 1u);
}

}  // namespace
}  // namespace trainyard
