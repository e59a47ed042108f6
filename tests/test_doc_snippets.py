"""Every ```python block of the docs (``docs/**/*.md``) and the README runs (see
``_doc_snippets`` for how blocks become scripts); the ones that need TensorFlow or JAX
run in ``test_doc_snippets_tf.py``. A block that cannot run is marked
``<!-- no-run: reason -->`` and listed here with its reason (as a skip)."""

import pytest

import _doc_snippets as snippets

SCRIPTS = snippets.all_scripts(needs_tf=False)
NOT_RUN = snippets.not_run()

# The teaching pages: each must keep at least one runnable block.
TEACHING = ["README.md", "index.md", "quickstart.md", "concepts.md", "guide.md", "writers.md",
            "learners.md", "migrating-from-reverb.md", "security.md", "checkpoints.md"]


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=[script.id for script in SCRIPTS])
def test_docs_snippet_runs(tmp_path, script):
    snippets.run(script, tmp_path)


@pytest.mark.parametrize("page", TEACHING)
def test_doc_page_has_runnable_snippets(page):
    path = snippets.ROOT / page if page == "README.md" else snippets.DOCS / page
    assert path.exists(), f"{path} is missing"
    assert snippets.scripts(path), f"{page} has no python snippet"


@pytest.mark.parametrize("where, reason", NOT_RUN or [("-", "")],
                         ids=[where for where, _ in NOT_RUN] or ["none"])
def test_blocks_not_run_say_why(where, reason):
    if where == "-":
        pytest.skip("no block is marked no-run")
    assert reason != "-", f"{where}: a no-run block must give its reason"
    pytest.skip(f"{where} is not run: {reason}")


def test_the_extraction(tmp_path):
    """The extraction itself: order, sessions, named programs, no-run markers, TF."""
    page = tmp_path / "page.md"
    page.write_text("\n".join([
        "```python", "a = 1", "```", "text",
        "```python", "# prog.py", "print('alone')", "```",
        "<!-- no-run: needs root -->", "", "```python", "import os; os.setuid(0)", "```",
        "```python", "from shmreplay import tf as shmreplay_tf", "b = a", "```",
        "```bash", "ls", "```", ""]))
    found = snippets.blocks(page)
    assert [block.no_run for block in found] == ["", "", "needs root", ""]
    scripts = snippets.scripts(page)
    assert [script.file_name for script in scripts] == ["page_session.py", "prog.py"]
    assert scripts[0].source == "a = 1\n\nfrom shmreplay import tf as shmreplay_tf\nb = a\n"
    assert [script.needs_tf for script in scripts] == [True, False]
