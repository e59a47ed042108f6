"""MkDocs hook: ``<!-- cli-help -->`` in a page becomes the ``shmreplay`` command's
``--help`` text and each subcommand's, run at build time (so the page is never out of
date). One process prints them all; ``--help`` loads no kernel and attaches to nothing."""

import json
import os
import subprocess
import sys

MARKER = "<!-- cli-help -->"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Run in a child process: the help of ``shmreplay`` and of each subcommand, as JSON.
PROGRAM = r"""
import contextlib, io, json, re
from shmreplay import cli

def help_of(*args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            cli.main([*args, "--help"])
        except SystemExit as stop:
            assert stop.code == 0, (args, stop.code)
    return out.getvalue()

top = help_of()
commands = re.search(r"\{([\w,]+)\}", top).group(1).split(",")
print(json.dumps([["", top]] + [[command, help_of(command)] for command in commands]))
"""


def _cli_help_markdown():
    env = {**os.environ, "COLUMNS": "88", "PYTHONPATH": os.pathsep.join(
        filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"shmreplay --help failed:\n{done.stderr}")
    parts = []
    for command, text in json.loads(done.stdout):
        words = " ".join(filter(None, ["shmreplay", command, "--help"]))
        if command:
            parts += ["", f"### shmreplay {command}", ""]
        parts += ["```text", f"$ {words}", text.rstrip(), "```"]
    return "\n".join(parts)


def on_page_markdown(markdown, page, config, files):
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, _cli_help_markdown())
