"""Checks that every measured figure on the performance page cites the JSON it comes from.

The page's conventions (``tests/test_performance_page.py`` runs ``check(page)``):

* **A figure** is a number written with a decimal point (``2.87``, ``0.94``) or with a
  unit of a measurement: ``x``, ``k``, ``M``, ``%``, ``ns``, ``µs``, ``us``, ``ms``
  (``4x``, ``142.9k``, ``309 µs``). Integers without those units (batch 256, 4096 items,
  5 s per case, dates and times, issue numbers) are not figures.
* **A citation** ``<!-- from: FILE EXPR[; EXPR ...] -->`` follows the figures it cites:
  its N expressions cite the N figures just before it, in order (``2.21x-2.39x<!-- from:
  large.json e1; e2 -->``). FILE is in ``benchmarks/results/``; EXPR is a Python
  expression over the file's top-level keys (and ``data``, the whole file) with
  ``pick(rows, key=value, ...)``, ``median``, ``gmean``, ``mean``, ``min``, ``max``,
  ``sum``, ``len``, ``abs``, ``sorted``, ``float``, ``zip``, ``range``. FILE may be
  ``@ALIAS``, named once by a ``<!-- source: @ALIAS FILE -->`` line (``_perf_tables``). The written figure must equal the value rounded
  to the digits written, after its unit (``k`` = 1e3, ``M`` = 1e6).
* **Not measurements**: ``<!-- given -->`` after numbers that are settings, not results
  (``every 5-50 ms``) exempts the figures since the block's previous marker; a figure next
  to the word *target* (``the 2x target``, ``target 1.5x``) is a goal; a version
  (``numba 0.68.1``, ``TensorFlow 2.21``) and a power (``2^20``) are names. Code (fenced
  or in backticks), link targets and headings are not read.
* **Tables** are generated blocks (``_perf_tables``), checked by regenerating them.
* **Figures with no JSON** sit between ``<!-- unrecorded: WHY -->`` and
  ``<!-- /unrecorded -->``; ``unrecorded(page)`` lists them, and nothing else is exempt.
"""

import math
import re
import statistics

import _perf_sources as sources
import _perf_tables as tables

FIGURE = re.compile(
    r"(?<![\w.^/])(?P<int>\d{1,3}(?:,\d{3})+|\d+)(?P<frac>\.\d+)?"
    r"(?P<unit>\s?(?:µs|us|ms|ns)|x|k|M|%)?(?![\w.]\d|\w)")
MARKER = re.compile(r"<!--\s*(?P<kind>from|given)\b:?(?P<arg>.*?)-->", re.S)
UNRECORDED = re.compile(r"<!-- unrecorded: (?P<why>.*?) -->\n(?P<body>.*?)<!-- /unrecorded -->",
                        re.S)
VERSIONED = ("python", "numpy", "numba", "cpprb", "reverb", "tensorflow", "tensorflow-cpu",
             "jax", "jaxlib", "dm-reverb", "tf", "linux")
SCALE = {"k": 1e3, "M": 1e6}


class CitationError(Exception):
    """A citation names a missing file or an expression that does not evaluate."""


def _blank(match):
    return re.sub(r"[^\n]", " ", match.group(0))


def _readable(page):
    """The page with what is not prose blanked out (same length, same lines)."""
    page = re.sub(r"^```.*?^```[^\n]*$", _blank, page, flags=re.S | re.M)
    page = tables.BLOCK.sub(_blank, page)
    page = UNRECORDED.sub(_blank, page)
    page = re.sub(r"^#.*$", _blank, page, flags=re.M)
    page = re.sub(r"`[^`\n]*`", _blank, page)
    return re.sub(r"\]\([^)\s]*\)", _blank, page)


def unrecorded(page):
    """``[(why, first line of the passage)]`` of the passages whose figures have no JSON."""
    return [(m.group("why"), m.group("body").strip().splitlines()[0][:80])
            for m in UNRECORDED.finditer(page)]


def _gmean(xs):
    xs = list(xs)
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def _pick(rows, **want):
    found = [r for r in rows if all(r.get(k) == v for k, v in want.items())]
    if len(found) != 1:
        raise CitationError(f"pick({want}) matched {len(found)} rows, not 1")
    return found[0]


HELPERS = {"pick": _pick, "median": statistics.median, "gmean": _gmean,
           "mean": statistics.mean, "min": min, "max": max, "sum": sum, "len": len,
           "abs": abs, "sorted": sorted, "float": float, "zip": zip, "range": range}


def evaluate(name, expr, _cache={}):
    """The value of ``expr`` over ``benchmarks/results/<name>``."""
    if name not in _cache:
        try:
            _cache[name] = sources.load(name)
        except sources.ResultsError as e:
            raise CitationError(str(e)) from None
    data = _cache[name]
    scope = {}
    if isinstance(data, dict):
        scope.update({k: v for k, v in data.items() if k.isidentifier()})
    scope.update(HELPERS, data=data, __builtins__={})
    try:
        return eval(expr, scope)  # the page's own expressions, over its own results
    except Exception as e:
        raise CitationError(f"{name} {expr}: {type(e).__name__}: {e}") from None


VERSION = re.compile(r"(?i)\b(?:" + "|".join(map(re.escape, VERSIONED)) + r") $")


def _exempt(text, m):
    """A goal next to the word *target*, or a version right after a library's name."""
    before = text[max(0, m.start() - 40):m.start()]
    after = text[m.end():m.end() + 25]
    near = re.findall(r"[\w-]+", before)[-3:] + re.findall(r"[\w-]+", after)[:2]
    if any(w.lower().startswith("target") for w in near):
        return True
    return bool(VERSION.search(before))


def _matches(written, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    digits = len(written.group("frac") or ".") - 1
    unit = (written.group("unit") or "").strip()
    shown = float(written.group("int").replace(",", "") + (written.group("frac") or ""))
    scaled = value / SCALE.get(unit, 1.0)
    return abs(scaled - shown) <= 0.5 * 10 ** -digits * (1 + 1e-9) + 1e-12


def check(page):
    """Problems with the page's figures, as ``'line N: ...'`` strings (empty: all good)."""
    text = _readable(page)
    problems = []
    try:
        known = tables.aliases(page)
    except tables.TableError as e:
        return [str(e)]
    line_of = lambda pos: text.count("\n", 0, pos) + 1  # noqa: E731
    for block in re.finditer(r"(?:[^\n]+\n?)+", text):
        start, body = block.start(), block.group(0)
        markers = list(MARKER.finditer(body))
        figures = [m for m in FIGURE.finditer(body)
                   if (m.group("frac") or m.group("unit"))
                   and not any(k.start() <= m.start() < k.end() for k in markers)
                   and not _exempt(body, m)]
        done = 0
        for marker in markers:
            before = [f for f in figures[done:] if f.end() <= marker.start()]
            if marker.group("kind") == "given":
                done += len(before)
                continue
            name, _, rest = marker.group("arg").strip().partition(" ")
            try:
                name = tables.resolve(name, known)
            except tables.TableError as e:
                problems.append(f"line {line_of(start + marker.start())}: {e}")
                done += len(before)
                continue
            exprs = [e.strip() for e in rest.split(";") if e.strip()]
            if len(exprs) > len(before):
                problems.append(f"line {line_of(start + marker.start())}: the citation has "
                                f"{len(exprs)} expressions but {len(before)} figures precede it")
                done += len(before)
                continue
            for f in before[:len(before) - len(exprs)]:
                problems.append(f"line {line_of(start + f.start())}: {f.group(0)!r} cites "
                                "nothing")
            for f, expr in zip(before[len(before) - len(exprs):], exprs):
                try:
                    value = evaluate(name, expr)
                except CitationError as e:
                    problems.append(f"line {line_of(start + f.start())}: {e}")
                    continue
                if not _matches(f, value):
                    problems.append(f"line {line_of(start + f.start())}: the page says "
                                    f"{f.group(0)!r}, {name} {expr} is {value!r}")
            done += len(before)
        for f in figures[done:]:
            problems.append(f"line {line_of(start + f.start())}: {f.group(0)!r} cites nothing")
    for spec, body in tables.blocks(page):
        try:
            fresh = "\n".join(tables.render(spec, known)) + "\n"
        except (tables.TableError, sources.ResultsError) as e:
            problems.append(f"table {spec!r}: {e}")
            continue
        if fresh != body:
            problems.append(f"table {spec!r} differs from its JSON "
                            "(run python benchmarks/plots.py --tables)")
    return problems
