"""The docs' ```python scripts that import TensorFlow or JAX (``_doc_snippets``): one
process per page's session and per named program, as in ``test_doc_snippets.py``."""

import pytest

import _doc_snippets as snippets

SCRIPTS = snippets.all_scripts(needs_tf=True)


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=[script.id for script in SCRIPTS])
def test_docs_snippet_runs(tmp_path, script):
    pytest.importorskip("tensorflow")
    pytest.importorskip("jax")
    snippets.run(script, tmp_path)
