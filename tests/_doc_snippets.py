"""Finding and running the ```python blocks of the docs and the README.

A page's blocks run in order as one script (a reader following the page), except a
block whose first line names a file (``# actors.py``): that one is a complete program
and runs on its own. A block that cannot run says so in an HTML comment on the line
before it (blank lines between allowed), with its reason::

    <!-- no-run: needs root (it changes the owner of /dev/shm's segments) -->

A script that imports TensorFlow or JAX (``tensorflow``, ``jax``, ``shmreplay.tf``,
``shmreplay.jax``) runs in ``test_doc_snippets_tf.py``: TensorFlow takes seconds to
import, so it is imported once per page there and never by the plain pages' scripts.
"""

import ast
import io
import os
import re
import subprocess
import sys
import tokenize
from pathlib import Path
from typing import List, NamedTuple

import _names
from shmreplay._shm import layout as _layout

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SHM = Path("/dev/shm")
# Generous: on a fresh checkout every process compiles the numba kernels first.
SNIPPET_TIMEOUT = 180

# Every Markdown page of the site, and the README.
PAGES = sorted(DOCS.rglob("*.md")) + [ROOT / "README.md"]

FENCE_START = re.compile(r"^```python[ \t]*$")
FENCE_END = re.compile(r"^```[ \t]*$")
NO_RUN = re.compile(r"^<!--\s*no-run:(.*?)-->\s*$")
FILE_NAME = re.compile(r"^#\s*([\w\-]+\.py)\s*$")
NEEDS_TF_OR_JAX = re.compile(
    r"^\s*(import|from)\s+(tensorflow|jax)\b|\bshmreplay\.(tf|jax)\b"
    r"|^\s*from\s+shmreplay\s+import\s+.*\b(tf|jax)\b", re.M)


class Block(NamedTuple):
    line: int            # the fence's line number in the page (1-based)
    source: str
    no_run: str          # the reason given, "" for a block that runs ("-" if none given)


class Script(NamedTuple):
    page: Path
    file_name: str
    source: str
    needs_tf: bool

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.file_name}"


def blocks(page: Path) -> List[Block]:
    """The page's ```python blocks, in order."""
    found, lines = [], page.read_text().splitlines()
    index = 0
    while index < len(lines):
        if not FENCE_START.match(lines[index]):
            index += 1
            continue
        before = index - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        marker = NO_RUN.match(lines[before]) if before >= 0 else None
        end = index + 1
        while end < len(lines) and not FENCE_END.match(lines[end]):
            end += 1
        source = "\n".join(lines[index + 1:end]) + "\n"
        reason = (marker.group(1).strip() or "-") if marker else ""
        found.append(Block(index + 1, source, reason))
        index = end + 1
    return found


def scripts(page: Path) -> List[Script]:
    """The runnable scripts of a page: the session of its plain blocks first, then each
    named program."""
    standalone, session = [], []
    for block in blocks(page):
        if block.no_run:
            continue
        first = block.source.splitlines()[0] if block.source.strip() else ""
        match = FILE_NAME.match(first)
        if match:
            standalone.append((match.group(1), block.source))
        else:
            session.append(block.source)
    named = [(f"{page.stem.replace('-', '_')}_session.py", "\n".join(session))] if session else []
    return [Script(page, name, source, bool(NEEDS_TF_OR_JAX.search(source)))
            for name, source in named + standalone]


def all_scripts(needs_tf: bool) -> List[Script]:
    return [script for page in PAGES for script in scripts(page) if script.needs_tf == needs_tf]


def not_run() -> List[tuple]:
    """``(page:line, reason)`` of every block marked no-run."""
    return [(f"{page.relative_to(ROOT)}:{block.line}", block.no_run)
            for page in PAGES for block in blocks(page) if block.no_run]


def segments(prefix="shmreplay"):
    if not SHM.is_dir():
        return set()
    return {name for name in os.listdir(SHM) if name.startswith(prefix)}


def objects_of(names=(), pids=()):
    """The /dev/shm entries of buffers ``names`` and of the port buffers (``port-P``)
    that processes ``pids`` made: what the program under test may have left. Anything
    else in /dev/shm is another program's, created or removed at any time (another
    test run, a user's job), and not ours to judge."""
    exact = {f"{sem}shmreplay.{name}" for name in names for sem in ("", "sem.")}
    entries = segments("")
    unnamed = _names.port_buffers_of(set(pids), entries)

    def buffer_of(entry):  # "shmreplay.x:t3:TOKEN" (a data segment) -> "shmreplay.x"
        parsed = _layout.parse_segment(entry)
        return entry if parsed is None else _layout.SEGMENT_PREFIX + parsed[0]

    return {entry for entry in entries if buffer_of(entry) in exact or entry in unnamed}


def with_names_of_this_run(source):
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


def run(script: Script, tmp_path: Path):
    """Runs the script in a process of its own; asserts it exits 0 and leaves no shared
    memory behind."""
    before = segments()
    source = with_names_of_this_run(script.source)
    path = tmp_path / script.file_name
    path.write_text(source)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with subprocess.Popen([sys.executable, str(path)], cwd=tmp_path, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=SNIPPET_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
    assert proc.returncode == 0, f"{script.id} failed:\n{stdout}\n{stderr}"
    # What the snippet may have made: buffers named by its string literals (the names of
    # this run above among them), and unnamed ones of its process.
    names = {node.value for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    assert not objects_of(names, [proc.pid]) - before, f"{script.id} left shared memory behind"
