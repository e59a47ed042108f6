"""Every public name of shmreplay has a docstring (the API reference is built from them).

Public means: everything in ``shmreplay.__all__``; in each public module, its
``__all__``, or else the classes and functions it defines whose names do not start
with ``_``; and the public methods and properties that each public class defines
itself (inherited ones are checked where they are defined). A module's docstring
counts too: the reference shows it as the module's introduction.
"""

import importlib
import inspect
import re
from pathlib import Path

import pytest

import shmreplay

# The modules the API reference documents. ``specs`` is a helper module whose public
# face is ``TensorSpec``; the others' public names are read from them.
PUBLIC_MODULES = [
    "shmreplay", "shmreplay.client", "shmreplay.server", "shmreplay.table",
    "shmreplay.selectors", "shmreplay.rate_limiters", "shmreplay.errors",
    "shmreplay.replay_sample", "shmreplay.writer", "shmreplay.trajectory_writer",
    "shmreplay.structured_writer", "shmreplay.checkpointers", "shmreplay.platform",
    "shmreplay.platform.checkpointers_lib", "shmreplay.cli", "shmreplay.tf", "shmreplay.jax",
    "shmreplay.ray",
]
EXPLICIT = {"shmreplay.specs": ["TensorSpec"]}
NEEDS = {"shmreplay.tf": "tensorflow", "shmreplay.jax": "jax", "shmreplay.ray": "ray"}


def _public_names(module):
    if module.__name__ in EXPLICIT:
        return EXPLICIT[module.__name__]
    if hasattr(module, "__all__"):
        return list(module.__all__)
    return [name for name, value in vars(module).items()
            if not name.startswith("_") and (inspect.isclass(value) or inspect.isfunction(value))
            and getattr(value, "__module__", None) == module.__name__]


def _documented(obj) -> bool:
    doc = obj.__doc__ if isinstance(obj, property) else inspect.getdoc(obj)
    return bool(doc and doc.strip())


def _own_members(cls):
    """(name, member) of the public methods and properties ``cls`` defines itself."""
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(member, (staticmethod, classmethod)):
            member = member.__func__
        if inspect.isfunction(member) or isinstance(member, property):
            yield name, member


def _missing(module_name):
    module = importlib.import_module(module_name)
    missing = [] if _documented(module) else [f"{module_name} (module)"]
    seen = set()
    for name in _public_names(module):
        value = getattr(module, name)
        if inspect.ismodule(value):
            continue  # documented as a module of its own
        if not (inspect.isclass(value) or inspect.isfunction(value)):
            continue  # constants and type aliases (Pattern = Any) carry no docstring
        where = f"{module_name}.{name}"
        if not _documented(value):
            missing.append(where)
        if inspect.isclass(value) and value not in seen:
            seen.add(value)
            if not value.__module__.startswith("shmreplay"):
                continue
            missing += [f"{where}.{attr}" for attr, member in _own_members(value)
                        if not _documented(member)]
    return missing


@pytest.mark.parametrize("module_name", PUBLIC_MODULES + sorted(EXPLICIT))
def test_public_names_have_docstrings(module_name):
    if module_name in NEEDS:
        pytest.importorskip(NEEDS[module_name])
    missing = _missing(module_name)
    assert not missing, "public names without a docstring:\n  " + "\n  ".join(missing)


ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"


def _modules_on_disk():
    """Every module of the package whose path has no part starting with ``_``."""
    found = set()
    for path in (ROOT / "shmreplay").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if not any(part.startswith("_") for part in parts):
            found.add(".".join(parts))
    return found


def test_every_public_module_is_checked():
    """A new public module (``shmreplay/NAME.py``) must join PUBLIC_MODULES (or
    EXPLICIT) above, and so the docstring check and the API reference."""
    assert _modules_on_disk() == set(PUBLIC_MODULES) | set(EXPLICIT)


def test_the_api_reference_shows_every_public_module():
    """Each public module has a ``::: module`` (or ``::: module.Name``) entry in the
    site's API reference (docs/reference/), so a new public module cannot be left out."""
    shown = {line.split()[1] for page in REFERENCE.glob("*.md")
             for line in page.read_text().splitlines() if re.match(r"^::: \S", line)}
    missing = [module for module in PUBLIC_MODULES + sorted(EXPLICIT)
               if not any(name == module or name.startswith(module + ".") for name in shown)]
    assert not missing, f"not in docs/reference/: {missing}"


def test_the_check_sees_a_missing_docstring():
    """The check itself: a public method without a docstring is reported."""
    class Documented:
        """A class."""

        def method(self):
            pass

        @property
        def value(self):
            """A property."""
            return 1

    assert [name for name, member in _own_members(Documented) if not _documented(member)] \
        == ["method"]


def test_the_version_is_the_packages():
    assert shmreplay.__version__ == "0.1.0"
