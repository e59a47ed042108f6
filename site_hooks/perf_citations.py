"""MkDocs hook for the performance page's markers (see ``benchmarks/_perf_cite.py``).

* Citations (``<!-- from: FILE EXPR -->``, ``<!-- given -->``) are for the test and the
  page's source, not for readers. Their expressions hold brackets that Markdown would
  read as reference links before it sees the comment, so they are dropped.
* A passage between ``<!-- unrecorded: WHY -->`` and ``<!-- /unrecorded -->`` (figures
  with no results file behind them) is shown in a box that says so, with WHY.
"""

import re

CITATION = re.compile(r"<!--\s*(?:from:|given\b).*?-->", re.S)
UNRECORDED = re.compile(r"<!-- unrecorded: (?P<why>.*?) -->\n(?P<body>.*?)<!-- /unrecorded -->",
                        re.S)


def _box(match):
    why = match.group("why").replace('"', "'")
    body = "\n".join(("    " + line) if line.strip() else ""
                     for line in match.group("body").strip("\n").splitlines())
    return f'!!! note "Not from a results file: {why}"\n\n{body}\n'


def on_page_markdown(markdown, page, **kwargs):
    if "<!-- unrecorded: " in markdown:
        markdown = UNRECORDED.sub(_box, markdown)
    return CITATION.sub("", markdown)
