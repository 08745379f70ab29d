#!/usr/bin/env python3
"""Lists the C++ functions over 100 lines and the files over 800 lines.

A report to read before and after a change, not a gate: it always exits 0
unless its arguments are wrong.

  tools/style_report.py                 # the tracked C++ sources in this repo
  tools/style_report.py --all           # also functions over 60 lines
  tools/style_report.py a.cc b.h        # just these files
  tools/style_report.py --top 20        # the 20 longest functions and files

A function's extent is found by matching braces after comments, strings and
character literals are blanked out: a '{' opens a function body when the
text before it (since the last ';', '{' or '}') ends a parameter list,
perhaps followed by qualifiers (const, override, noexcept, a trailing return
type) or a constructor's initializer list. Lambdas count as part of the
function around them. Tests (*_test.cc) are listed apart.
"""

import argparse
import os
import re
import subprocess
import sys

SOURCE_EXTENSIONS = (".cc", ".h", ".cu", ".cuh")
FUNCTION_LIMIT = 100
SOFT_FUNCTION_LIMIT = 60
FILE_LIMIT = 800

# What may stand between a parameter list's ')' and the body's '{'.
_TAIL = re.compile(
    r"\)\s*(?:const\s*|override\s*|final\s*|noexcept(?:\([^()]*\))?\s*|"
    r"mutable\s*|&&?\s*|->\s*[\w:<>,\s*&]+?\s*)*$")
# A constructor's initializer list: ") : a_(x), b_{y}" (already blanked of
# nested braces by the time it is matched, see _preamble_is_function).
_INIT_LIST = re.compile(r"\)\s*(?:noexcept\s*)?:\s*[\w:]+\s*[({]")
_NOT_FUNCTION = re.compile(
    r"\b(?:if|for|while|switch|catch|namespace|class|struct|union|enum|"
    r"extern)\b|=\s*$|\[[^\]]*\]\s*(?:\([^()]*\))?\s*(?:mutable\s*)?"
    r"(?:->\s*[\w:<>]+\s*)?$")
_NAME = re.compile(
    r"((?:[\w:]*::)?operator\s*(?:\(\)|[^\s(]+)|[~\w:<>]+)\s*\(")


def blank_code(text):
  """Returns text with comments, strings and char literals replaced by
  spaces (newlines kept), so braces and lines can be counted."""
  out = []
  i, n = 0, len(text)
  while i < n:
    c = text[i]
    if text.startswith("//", i):
      j = text.find("\n", i)
      j = n if j < 0 else j
      out.append(" " * (j - i))
      i = j
    elif text.startswith("/*", i):
      j = text.find("*/", i + 2)
      j = n if j < 0 else j + 2
      out.append(re.sub(r"[^\n]", " ", text[i:j]))
      i = j
    elif text.startswith('R"', i) and (i == 0 or not
                                       (text[i - 1].isalnum() or
                                        text[i - 1] == "_")):
      m = re.match(r'R"([^(\s]*)\(', text[i:])
      if not m:
        out.append(c)
        i += 1
        continue
      end = text.find(")" + m.group(1) + '"', i)
      j = n if end < 0 else end + len(m.group(1)) + 2
      out.append('""' + re.sub(r"[^\n]", " ", text[i + 2:j]))
      i = j
    elif c in "\"'":
      if c == "'" and i > 0 and text[i - 1].isalnum():
        out.append(" ")  # digit separator: 1'000'000
        i += 1
        continue
      j = i + 1
      while j < n and text[j] != c and text[j] != "\n":
        j += 2 if text[j] == "\\" else 1
      j = min(j + 1, n)
      out.append(c + " " * (j - i - 2) + c if j - i >= 2 else c)
      i = j
    else:
      out.append(c)
      i += 1
  return "".join(out)


def _preamble_is_function(pre):
  """Whether the code before a '{' (since the last ';', '{' or '}') opens a
  function body."""
  pre = re.sub(r"^\s*#.*$", "", pre, flags=re.M).strip()
  if not pre or _NOT_FUNCTION.search(pre):
    return False
  # Drop template argument lists' contents so "->" and ":" inside them do
  # not confuse the tail checks.
  if _TAIL.search(pre):
    return _NAME.search(pre) is not None
  return _INIT_LIST.search(pre) is not None


def functions(text):
  """Yields (name, first_line, last_line) of each function definition."""
  code = blank_code(text)
  # The start of each line, to turn offsets into 1-based line numbers.
  starts = [0]
  for m in re.finditer("\n", code):
    starts.append(m.end())

  def line_of(offset):
    lo, hi = 0, len(starts) - 1
    while lo < hi:
      mid = (lo + hi + 1) // 2
      if starts[mid] <= offset:
        lo = mid
      else:
        hi = mid - 1
    return lo + 1

  stack = []  # for each open brace: (is_function_body, offset)
  last_stop = 0  # where the current preamble starts
  inside = 0  # how many function bodies are open
  i = 0
  while i < len(code):
    c = code[i]
    if c == "{":
      is_function = False
      if inside == 0:
        pre = code[last_stop:i]
        # A constructor's initializer list may hold braces: "a_{x}, b_{y}".
        # Its '{' come after ") :"; treat them as part of the preamble.
        if re.search(r"\)\s*(?:noexcept\s*)?:\s*[^;]*[\w>]\s*$", pre) and \
            _init_brace_follows(code, i):
          j = _skip_braces(code, i)
          i = j
          continue
        is_function = _preamble_is_function(pre)
      stack.append((is_function, i))
      if is_function:
        inside += 1
      last_stop = i + 1
    elif c == "}":
      if stack:
        is_function, start = stack.pop()
        if is_function:
          inside -= 1
          pre = code[_preamble_start(code, start):start]
          m = None
          for m in _NAME.finditer(pre):
            if not re.match(r"(?:if|for|while|switch|return|sizeof|"
                            r"decltype|alignof|static_assert)$",
                            m.group(1)):
              break
          name = m.group(1) if m else "?"
          yield name, line_of(_preamble_line_start(code, start)), line_of(i)
      last_stop = i + 1
    elif c == ";":
      last_stop = i + 1
    i += 1


def _init_brace_follows(code, i):
  """Whether the '{' at i is a member's brace initializer (followed by
  '}' and then ',' or another '{' body), not the constructor's body."""
  j = _skip_braces(code, i)
  rest = code[j:].lstrip()
  return rest.startswith(",") or rest.startswith("{")


def _skip_braces(code, i):
  """The offset just after the brace group opening at i."""
  depth = 0
  for j in range(i, len(code)):
    if code[j] == "{":
      depth += 1
    elif code[j] == "}":
      depth -= 1
      if depth == 0:
        return j + 1
  return len(code)


def _preamble_start(code, brace):
  """Where the preamble of the '{' at brace starts: after the last ';' or a
  '{' / '}' that is not a member's brace initializer."""
  j = brace - 1
  while j >= 0:
    c = code[j]
    if c == "}":
      # A brace initializer in an initializer list: skip over it.
      k = j - 1
      d = 1
      while k >= 0 and d:
        if code[k] == "}":
          d += 1
        elif code[k] == "{":
          d -= 1
        k -= 1
      before = code[:k + 1].rstrip()
      if before and (before[-1].isalnum() or before[-1] in "_>"):
        if re.search(r"\)\s*(?:noexcept\s*)?:[^;{}]*$", code[:k + 1]) or \
            re.search(r",\s*[\w:]+$", before):
          j = k
          continue
      return j + 1
    if c in ";{":
      return j + 1
    j -= 1
  return 0


def _preamble_line_start(code, brace):
  """The offset where brace's preamble starts, after blanks and an access
  specifier."""
  start = _preamble_start(code, brace)
  text = code[start:brace]
  m = re.match(r"\s*(?:(?:public|protected|private)\s*:(?!:)\s*)?", text)
  return start + m.end()


def tracked_sources(root):
  try:
    out = subprocess.run(["git", "-C", root, "ls-files"], check=True,
                         capture_output=True, text=True).stdout.split()
  except (OSError, subprocess.CalledProcessError):
    out = []
    for d, _, files in os.walk(root):
      if "/bazel-" in d or "/.git" in d:
        continue
      out += [os.path.relpath(os.path.join(d, f), root) for f in files]
  return sorted(os.path.join(root, p) for p in out
                if p.endswith(SOURCE_EXTENSIONS) and "third_party/" not in p)


def is_test(path):
  base = os.path.basename(path)
  return re.search(r"_test\.(cc|cu)$", base) is not None or \
      base.startswith("test_")


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("files", nargs="*", help="C++ files (default: the "
                      "repository's tracked sources)")
  parser.add_argument("--all", action="store_true",
                      help=f"also list functions over {SOFT_FUNCTION_LIMIT}")
  parser.add_argument("--top", type=int, default=0,
                      help="list the N longest functions and files instead")
  args = parser.parse_args(argv)
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  paths = args.files or tracked_sources(root)
  rel = lambda p: os.path.relpath(p, root) if not args.files else p

  funcs, sizes = [], []
  for p in paths:
    try:
      with open(p, encoding="utf-8", errors="replace") as f:
        text = f.read()
    except OSError as e:
      print(f"style_report: {p}: {e.strerror}", file=sys.stderr)
      return 2
    sizes.append((text.count("\n"), rel(p)))
    for name, first, last in functions(text):
      funcs.append((last - first + 1, rel(p), first, name))

  funcs.sort(key=lambda f: (-f[0], f[1], f[2]))
  sizes.sort(key=lambda s: (-s[0], s[1]))
  if args.top:
    print(f"longest functions (top {args.top}):")
    for n, p, line, name in funcs[:args.top]:
      print(f"  {n:5d}  {p}:{line}  {name}{' (test)' if is_test(p) else ''}")
    print(f"largest files (top {args.top}):")
    for n, p in sizes[:args.top]:
      print(f"  {n:5d}  {p}")
    return 0

  limit = SOFT_FUNCTION_LIMIT if args.all else FUNCTION_LIMIT
  for tests in (False, True):
    rows = [f for f in funcs if f[0] > limit and is_test(f[1]) == tests]
    kind = "test functions" if tests else "functions"
    print(f"{kind} over {limit} lines: {len(rows)}")
    for n, p, line, name in rows:
      print(f"  {n:5d}  {p}:{line}  {name}")
  big = [s for s in sizes if s[0] > FILE_LIMIT]
  print(f"files over {FILE_LIMIT} lines: {len(big)}")
  for n, p in big:
    print(f"  {n:5d}  {p}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
