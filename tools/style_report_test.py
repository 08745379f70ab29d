#!/usr/bin/env python3
"""tools/style_report.py finds each function's extent and no other block's."""

import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import style_report  # pylint: disable=g-import-not-at-top

SAMPLE = r'''// A comment with { braces } that must not count.
#include <string>

namespace a {
namespace {

struct Options {
  int x = 1;
  std::vector<int> v = {1, 2, 3};
};

int Plain(int a,
          int b) {
  if (a > b) {
    return a;
  }
  const char* s = "}{";  // a string with braces
  char c = '{';
  return b;
}

class Widget {
 public:
  Widget(int a, int b) : a_(a), b_{b}, v_{1, 2} {
    for (int i = 0; i < 3; ++i) {
      a_ += i;
    }
  }
  int Get() const { return a_; }
  auto Twice() const -> int {
    auto f = [this](int k) {
      return k * a_;
    };
    return f(2);
  }

 private:
  int a_;
  int b_;
  std::vector<int> v_;
};

}  // namespace

std::string Raw() {
  return R"x(a } raw { string)x";
}

bool operator==(const Options& l, const Options& r) {
  return l.x == r.x;
}

enum class Kind { kA, kB };

}  // namespace a
'''


class FunctionsTest(unittest.TestCase):

  def test_finds_each_function_and_its_extent(self):
    found = {name: (first, last)
             for name, first, last in style_report.functions(SAMPLE)}
    lines = SAMPLE.split("\n")

    def line(text):
      return next(i + 1 for i, l in enumerate(lines) if text in l)

    self.assertEqual(
        sorted(found), sorted(["Plain", "Widget", "Get", "Twice", "Raw",
                               "operator=="]))
    self.assertEqual(found["Plain"], (line("int Plain("), line("return b;") + 1))
    self.assertEqual(found["Widget"][0], line("Widget(int a, int b)"))
    self.assertEqual(found["Widget"][1], line("a_ += i;") + 2)
    self.assertEqual(found["Get"], (line("int Get()"), line("int Get()")))
    self.assertEqual(found["Twice"], (line("auto Twice()"),
                                      line("return f(2);") + 1))
    self.assertEqual(found["Raw"], (line("std::string Raw()"),
                                    line("raw { string") + 1))

  def test_blanking_keeps_lines_and_drops_braces_in_text(self):
    blank = style_report.blank_code(SAMPLE)
    self.assertEqual(blank.count("\n"), SAMPLE.count("\n"))
    self.assertNotIn("}{", blank)
    self.assertNotIn("raw {", blank)


class ReportTest(unittest.TestCase):

  def test_lists_long_functions_and_files(self):
    body = "\n".join(f"  x += {i};" for i in range(120))
    src = f"int Long() {{\n  int x = 0;\n{body}\n  return x;\n}}\n"
    short = "int Short() {\n  return 1;\n}\n" + "// filler\n" * 900
    with tempfile.TemporaryDirectory() as d:
      long_path = os.path.join(d, "long.cc")
      short_path = os.path.join(d, "short.cc")
      test_path = os.path.join(d, "long_test.cc")
      for p, text in ((long_path, src), (short_path, short),
                      (test_path, src)):
        with open(p, "w") as f:
          f.write(text)
      out = subprocess.run(
          [sys.executable, style_report.__file__, long_path, short_path,
           test_path], check=True, capture_output=True, text=True).stdout
    self.assertIn("functions over 100 lines: 1\n", out)
    self.assertIn(f"  124  {long_path}:1  Long", out)
    self.assertIn("test functions over 100 lines: 1\n", out)
    self.assertIn("files over 800 lines: 1\n", out)
    self.assertIn(f"  903  {short_path}", out)
    self.assertNotIn("Short", out)

  def test_missing_file_is_an_error(self):
    r = subprocess.run([sys.executable, style_report.__file__, "/nonexistent.cc"],
                       capture_output=True, text=True)
    self.assertEqual(r.returncode, 2)
    self.assertIn("/nonexistent.cc", r.stderr)


if __name__ == "__main__":
  unittest.main()
