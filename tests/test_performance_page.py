"""docs/performance.md (and the README's figures) quote the JSON results, not numbers
typed by hand.

Every measured figure on the page either sits in a generated table block (checked by
regenerating it from its JSON) or is followed by a ``<!-- from: FILE EXPR -->`` citation
whose value, rounded to the digits written, is the figure. What counts as a figure and
what does not (settings marked ``<!-- given -->``, goals next to the word *target*,
versions, powers such as 2^20, integers without a unit such as batch 256, code) is
defined in ``benchmarks/_perf_cite.py``'s docstring. Passages with figures that have no
JSON behind them live on docs/performance-history.md, each marked
``<!-- unrecorded: WHY -->`` with its reason; the performance page has none.
Fast, no TensorFlow, no matplotlib.
"""

import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import _perf_cite as cite  # noqa: E402
import _perf_sources as sources  # noqa: E402
import _perf_tables as tables  # noqa: E402

PAGE = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
README = (ROOT / "README.md").read_text(encoding="utf-8")
HISTORY = (ROOT / "docs" / "performance-history.md").read_text(encoding="utf-8")


def test_every_figure_on_the_page_matches_the_json_it_cites():
    problems = cite.check(PAGE)
    assert not problems, "docs/performance.md:\n" + "\n".join(problems)


def test_every_figure_in_the_readme_matches_the_json_it_cites():
    problems = cite.check(README)
    assert not problems, "README.md:\n" + "\n".join(problems)
    assert README.count("<!-- from: ") >= 8


def test_the_page_has_tables_and_citations():
    assert len(tables.blocks(PAGE)) >= 10
    assert PAGE.count("<!-- from: ") >= 20


def test_the_page_shows_every_figure():
    for name in sources.FIGURES:
        assert f"img/perf/{name}.svg" in PAGE, name
        assert (ROOT / "docs" / "img" / "perf" / f"{name}.svg").exists(), name


def test_the_page_quotes_no_figure_without_json():
    assert cite.unrecorded(PAGE) == []


def test_the_history_page_holds_only_passages_that_say_why():
    # (Old one-off measurements, and runs a later run's file replaced: kept as history,
    # each marked with the reason it has no JSON; a figure outside them fails.)
    assert cite.check(HISTORY) == []
    passages = cite.unrecorded(HISTORY)
    assert passages
    for why, passage in passages:
        assert why.strip(), f"{passage!r}: an unrecorded passage must say why"


# ------------------------------------------------------------------ the checker itself

SAMPLE = {"results": [{"op": "add", "n": 1, "ratio": 4.4785, "us": 2.8686},
                      {"op": "add", "n": 11, "ratio": 2.6877, "us": 4.8497}],
          "rate": 190308.3, "machine": {"date": "2026-11-25T18:26:20+00:00",
                                        "git_commit": "9604233", "loadavg_at_start": [0.74]}}


@pytest.fixture
def sample(monkeypatch, tmp_path):
    import json
    (tmp_path / "s.json").write_text(json.dumps(SAMPLE))
    monkeypatch.setattr(sources, "RESULTS_DIR", str(tmp_path))
    monkeypatch.setattr(cite.evaluate, "__defaults__", ({},))


def test_a_cited_figure_matches_at_the_digits_written(sample):
    ok = "Add 1 is **4.48x**<!-- from: s.json pick(results, n=1)['ratio'] --> faster.\n"
    assert cite.check(ok) == []
    assert cite.check(ok.replace("4.48x", "4.5x")) == []
    assert cite.check("It did 190.3k<!-- from: s.json rate --> inserts/s.\n") == []
    wrong = cite.check(ok.replace("4.48x", "4.27x"))
    assert len(wrong) == 1 and "4.27x" in wrong[0]


def test_a_range_cites_each_end(sample):
    ok = "From 2.69x-4.48x<!-- from: s.json results[1]['ratio']; results[0]['ratio'] -->.\n"
    assert cite.check(ok) == []
    short = cite.check(ok.replace("results[1]['ratio']; ", ""))
    assert len(short) == 1 and "2.69x" in short[0] and "cites nothing" in short[0]


def test_an_uncited_figure_fails_and_non_measurements_pass(sample):
    assert "cites nothing" in cite.check("A call took 2.87 µs.\n")[0]
    assert "cites nothing" in cite.check("It was 51x faster.\n")[0]
    assert cite.check("The 2x target, batch 256, 2^20 items, numba 0.68.1, `3.5 µs`, "
                      "4096 items, 2026-11-25 18:26 UTC.\n") == []
    assert cite.check("Every 5-50 ms<!-- given --> a stop.\n") == []
    assert cite.check("<!-- unrecorded: one-off -->\nIt took 3.2 µs.\n<!-- /unrecorded -->\n") \
        == []


def test_a_bad_citation_is_reported(sample):
    assert "no results file" in cite.check("1.0x<!-- from: nope.json 1 -->\n")[0]
    assert "KeyError" in cite.check("1.0x<!-- from: s.json data['nope'] -->\n")[0]
    assert "2 expressions" in cite.check("1.0x<!-- from: s.json 1; 1 -->\n")[0]


def test_a_table_block_is_regenerated_and_compared(sample, monkeypatch):
    monkeypatch.setitem(tables.TABLES, "t", lambda files: ["| a |", "|---|",
                                                          f"| {files[0][1]['rate']:.1f} |"])
    page = "<!-- table: t s.json -->\n<!-- /table -->\n"
    filled = tables.fill(page)
    assert "| 190308.3 |" in filled and "commit `9604233`" in filled
    assert cite.check(filled) == []
    stale = cite.check(filled.replace("190308.3", "190308.4"))
    assert len(stale) == 1 and "differs from its JSON" in stale[0]
    assert "unknown table" in cite.check("<!-- table: nope s.json -->\n<!-- /table -->\n")[0]


def test_a_section_names_its_run_once(sample):
    page = ("<!-- source: @run s.json -->\n\n"
            "Add 1 is 4.48x<!-- from: @run results[0]['ratio'] --> faster.\n")
    assert cite.check(page) == []
    assert "no <!-- source: @other" in cite.check(page.replace("@run results", "@other results"))[0]
    assert "defined twice" in cite.check(page + "<!-- source: @run s.json -->\n")[0]
