"""The examples and the documentation's code run against the current API and clean up.

* ``examples/demo.py`` runs for a few seconds, reports nonzero insert and sample rates,
  exits 0 and leaves nothing in /dev/shm; on Ctrl-C it stops its workers, exits 130 and
  leaves nothing either.
* Every ```python block of the user docs (``docs/index.md``, ``concepts.md``,
  ``guide.md``, ``writers.md``, ``learners.md``, ``migrating-from-reverb.md``) runs. The blocks of one page run in order as
  one script (a reader following the page), except a block whose first line names a
  file (``# actors.py``): that one is a complete program and runs on its own.
"""

import ast
import io
import os
import re
import signal
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

import _names
import _waiting
from shmreplay._shm import layout as _layout

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "demo.py"
DOCS = ROOT / "docs"
SHM = Path("/dev/shm")

# Generous: on a fresh checkout every process compiles the numba kernels first.
DEMO_TIMEOUT = 240
SNIPPET_TIMEOUT = 180

# A progress line: "  2.0s       41,476      346,387      43,357".
PROGRESS = re.compile(r"^\s*(\d+\.\d)s\s+([\d,]+)\s+([\d,]+)\s+([\d,]+)\s*$", re.M)


def _segments(prefix="shmreplay"):
    if not SHM.is_dir():
        return set()
    return {name for name in os.listdir(SHM) if name.startswith(prefix)}


def _objects_of(names=(), pids=()):
    """The /dev/shm entries of buffers ``names`` and of the port buffers (``port-P``)
    that processes ``pids`` made: what the program under test may have left. Anything
    else in /dev/shm is another program's, created or removed at any time (another
    test run, a user's job), and not ours to judge."""
    exact = {f"{sem}shmreplay.{name}" for name in names for sem in ("", "sem.")}
    entries = _segments("")
    unnamed = _names.port_buffers_of(set(pids), entries)

    def buffer_of(entry):  # "shmreplay.x:t3:TOKEN" (a data segment) -> "shmreplay.x"
        parsed = _layout.parse_segment(entry)
        return entry if parsed is None else _layout.SEGMENT_PREFIX + parsed[0]

    return {entry for entry in entries if buffer_of(entry) in exact or entry in unnamed}


def _rates(output):
    """(inserts/s, samples/s, table size) of every progress line."""
    return [tuple(int(v.replace(",", "")) for v in match.groups()[1:])
            for match in PROGRESS.finditer(output)]


def _demo_command(name, *args):
    return [sys.executable, str(DEMO), "--name", name, *args]


@pytest.mark.slow
def test_demo_runs_reports_rates_and_cleans_up():
    name = _names.unique("demo")
    before = _segments()
    proc = subprocess.run(_demo_command(name, "--seconds", "3", "--actors", "1"), cwd=ROOT,
                          capture_output=True, text=True, timeout=DEMO_TIMEOUT)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    rates = _rates(proc.stdout)
    assert len(rates) == 3, output  # one line per second
    assert any(inserts > 0 and samples > 0 for inserts, samples, _ in rates), output
    summary = re.search(r"([\d,]+) inserted \(([\d,]+)/s\), ([\d,]+) sampled \(([\d,]+)/s\)",
                        proc.stdout)
    assert summary, output
    assert all(int(v.replace(",", "")) > 0 for v in summary.groups()), output
    assert "nothing left in /dev/shm" in proc.stdout, output
    assert not _segments(f"shmreplay.{name}"), output
    assert not _objects_of([name]) - before, output


@pytest.mark.slow
def test_demo_stops_cleanly_on_ctrl_c():
    """Ctrl-C reaches every process of the foreground group, as a terminal sends it."""
    name = _names.unique("demo")
    before = _segments()
    proc = subprocess.Popen(_demo_command(name, "--seconds", "120", "--actors", "2"), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    with _waiting.OutputWatch(proc, lambda line: bool(PROGRESS.match(line))) as watch:
        assert watch.seen.wait(DEMO_TIMEOUT), watch.output
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    output = watch.output
    assert proc.returncode == 128 + signal.SIGINT, output
    assert "Traceback" not in output, output
    assert "stopped early by Ctrl-C" in output, output
    assert not _waiting.wait_until_gone(proc.pid), f"workers outlived the demo:\n{output}"
    assert not _segments(f"shmreplay.{name}"), output
    assert not _objects_of([name], [proc.pid]) - before, output


# --- the documentation's snippets ----------------------------------------------------------

FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
FILE_NAME = re.compile(r"^#\s*([\w\-]+\.py)\s*$")


def _scripts(page: Path):
    """The runnable scripts of a page: ``[(file name, source), ...]``."""
    blocks = FENCE.findall(page.read_text())
    standalone, session = [], []
    for block in blocks:
        first = block.splitlines()[0] if block.strip() else ""
        match = FILE_NAME.match(first)
        if match:
            standalone.append((match.group(1), block))
        else:
            session.append(block)
    scripts = []
    if session:
        scripts.append((f"{page.stem.replace('-', '_')}_session.py", "\n".join(session)))
    return scripts + standalone


# The teaching pages. (docs/api-contract.md is a compact summary, not runnable code.)
DOC_PAGES = [DOCS / name for name in
             ("index.md", "concepts.md", "guide.md", "writers.md", "learners.md",
              "migrating-from-reverb.md")]
DOC_SCRIPTS = [(page, file_name, source) for page in DOC_PAGES if page.exists()
               for file_name, source in _scripts(page)]


def _with_names_of_this_run(source):
    """``source`` with each buffer name it gives in a string literal (``Server(...,
    name="quickstart")``, ``Client("quickstart")``) replaced, everywhere that literal
    appears, by a unique name of this test run. Under its own name, the snippet would
    collide with another run of this suite on the machine, or a user's buffer."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            call = getattr(node.func, "attr", getattr(node.func, "id", None))
            given = [kw.value for kw in node.keywords if kw.arg == "name" and call == "Server"]
            given += node.args[:1] if call == "Client" else []
            names |= {arg.value for arg in given
                      if isinstance(arg, ast.Constant) and isinstance(arg.value, str)}
    unique = {name: _names.unique(name) for name in names}
    lines = source.splitlines(keepends=True)
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    for token in reversed(tokens):  # from the end: earlier columns stay valid
        if token.type != tokenize.STRING or token.start[0] != token.end[0]:
            continue
        try:
            value = ast.literal_eval(token.string)
        except ValueError:  # an f-string
            continue
        if isinstance(value, str) and value in unique:
            row, start, end = token.start[0] - 1, token.start[1], token.end[1]
            lines[row] = lines[row][:start] + f'"{unique[value]}"' + lines[row][end:]
    return "".join(lines)


@pytest.mark.parametrize("page", DOC_PAGES, ids=[page.name for page in DOC_PAGES])
def test_doc_page_has_runnable_snippets(page):
    assert page.exists(), f"{page} is missing"
    assert _scripts(page), f"{page.name} has no python snippet"


@pytest.mark.slow
@pytest.mark.parametrize("page, file_name, source", DOC_SCRIPTS,
                         ids=[f"{page.name}:{file_name}" for page, file_name, _ in DOC_SCRIPTS])
def test_docs_snippet_runs(tmp_path, page, file_name, source):
    before = _segments()
    source = _with_names_of_this_run(source)
    script = tmp_path / file_name
    script.write_text(source)
    with subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=SNIPPET_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
    assert proc.returncode == 0, (
        f"{page.name} ({file_name}) failed:\n{stdout}\n{stderr}")
    # What the snippet may have made: buffers named by its string literals (the names of
    # this run above among them), and unnamed ones of its process.
    names = {node.value for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    assert not _objects_of(names, [proc.pid]) - before, (
        f"{page.name} ({file_name}) left shared memory behind")
