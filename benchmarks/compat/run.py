"""Runs Reverb's, Acme's and TF-Agents' own Reverb tests against shmreplay.

    python benchmarks/compat/run.py                 # set up (first time) and run all
    python benchmarks/compat/run.py --only acme     # one suite (reverb, acme, tf_agents)
    python benchmarks/compat/run.py --only client_test.py

What it does (benchmarks/compat/README.md says more):

1. A venv of its own (``--venv``, default /work/compat-venv), made with this Python:
   TensorFlow 2.21 (what shmreplay is tested with), dm-acme 0.4.0 and tf-agents 0.19.0
   installed with ``--no-deps`` plus the dependencies their Reverb code and tests use.
   Why without their pins: tf-agents 0.19 pins ``tensorflow-probability~=0.23`` (made
   for TensorFlow 2.15), ``typing-extensions==4.5`` and ``pygame==2.1.3`` (no wheel for
   Python 3.11's builds here), and its ``reverb`` extra pins ``dm-reverb~=0.14`` and
   ``tensorflow~=2.15``; dm-acme 0.4.0 pins ``dm-launchpad==0.5.0`` (no Python 3.11
   wheel, and not used by its adders). TensorFlow 2.15 has no wheel for numpy 2, which
   shmreplay needs, so the old pins cannot be met together with shmreplay: the tests
   run on TensorFlow 2.21 with tensorflow-probability 0.25 and tf-keras 2.21 (TF-Agents
   needs Keras 2: ``TF_USE_LEGACY_KERAS=1``). shmreplay itself is installed editable
   from this checkout.
2. Reverb's test files: the dm-reverb 0.14.0 wheel on PyPI ships no ``*_test.py``
   (checked with ``pip download dm-reverb==0.14.0 --no-deps``), so they are read from
   Reverb's git repository at tag v0.14.0 (``--reverb-git``, a clone or mirror of
   github.com/google-deepmind/reverb) into a work directory outside this repository.
   Acme's (``acme/adders/reverb/*_test.py``) and TF-Agents' (``reverb_replay_buffer_test``,
   ``reverb_utils_test``) ship in their packages and run from the venv.
3. Each file runs under pytest in its own process, with the ``reverb`` shim
   (benchmarks/compat/shim) first on sys.path and the working directory outside the
   repository. Outcomes are recorded case by case (compat_plugin.py); a file whose run
   hangs past ``--file-timeout`` is killed, its running case counted as an error
   ("timeout"), and the file run again without the cases already done.
4. Writes benchmarks/results/compat.json and compat.md: per-file and total counts, and
   every failing case with its first error line and its class: "C++ internals" (tests
   of Reverb's C++ bindings), "issue 19" (None dimensions, variable-length items, tables
   of mixed structures, strings, StructuredWriter, PatternDataset) or "gap" (a
   difference shmreplay should not have: issue 17's to fix).
"""

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SHIM = os.path.join(HERE, "shim")
STUBS = os.path.join(HERE, "stubs")  # launchpad: see stubs/launchpad/__init__.py
RESULTS = os.path.join(REPO, "benchmarks", "results")

REVERB_TAG = "v0.14.0"
REVERB_FILES = [  # every *_test.py of Reverb 0.14.0's Python package
    "client_test.py", "pattern_dataset_test.py", "pybind_test.py", "rate_limiters_test.py",
    "replay_sample_test.py", "server_test.py", "structured_writer_test.py",
    "tf_client_test.py", "timestep_dataset_eager_test.py", "timestep_dataset_test.py",
    "trajectory_dataset_eager_test.py", "trajectory_dataset_test.py",
    "trajectory_writer_test.py", "platform/checkpointers_lib_test.py",
    "server_executable/server_from_proto_test.py",
]
ACME_FILES = ["acme/adders/reverb/episode_test.py", "acme/adders/reverb/sequence_test.py",
              "acme/adders/reverb/transition_test.py"]
TF_AGENTS_FILES = ["tf_agents/replay_buffers/reverb_replay_buffer_test.py",
                   "tf_agents/replay_buffers/reverb_utils_test.py"]

# What the venv gets besides shmreplay. TensorFlow as shmreplay's own tests use it.
BASE_PACKAGES = [
    "jax",  # Acme's test utilities import it (acme.utils.tree_utils)
    # TF-Agents' tests turn 1-element arrays into ints with int(), which NumPy 2.4 refuses
    # ("only 0-dimensional arrays can be converted"); 2.3 still allows it.
    "numpy<2.4",
    "tensorflow==2.21.0", "tf-keras==2.21.0", "tensorflow-probability==0.25.0",
    "dm-tree", "dm-env", "absl-py", "gin-config", "cloudpickle", "gym<=0.23.0", "mock",
    "pillow", "wrapt", "six", "protobuf", "typing-extensions", "portpicker", "pytest",
    "pytest-timeout",
]
NO_DEPS_PACKAGES = ["dm-acme==0.4.0", "tf-agents==0.19.0"]

# --- classification of failing cases --------------------------------------------------
# Whole files: what they test.
FILE_CLASSES = {
    "pybind_test.py": "C++ internals",
    "server_from_proto_test.py": "C++ internals",   # the server's proto config
    "checkpointers_lib_test.py": "C++ internals",   # pybind checkpointer
}
# (regex on "file::case" id or on the first error line, class). First match wins.
CASE_CLASSES = [
    (r"reverb\.pybind|pybind\.", "C++ internals", "uses Reverb's C++ bindings"),
    (r"A table holds items of one shape here \(variable-length", "issue 19",
     "configs of different lengths into one table: variable-length items"),
]


def classify(file_name, case_id, message):
    """``(class, why)`` of a failing case: the file's class, else the first rule that
    matches its id or first error line, else "gap"."""
    base = os.path.basename(file_name)
    if base in FILE_CLASSES:
        return FILE_CLASSES[base], "the whole file tests it"
    for pattern, category, why in CASE_CLASSES + _load_known():
        if re.search(pattern, case_id) or re.search(pattern, message or ""):
            return category, why
    return "gap", ""


def _load_known():
    """Case-by-case classes (known.json beside this script: [[regex, class, why], ...])."""
    path = os.path.join(HERE, "known.json")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [tuple(entry) for entry in json.load(f)]


# --- set-up ----------------------------------------------------------------------------

def venv_python(venv):
    return os.path.join(venv, "bin", "python")


def set_up(venv):
    if not os.path.exists(venv_python(venv)):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    pip = [venv_python(venv), "-m", "pip", "install", "-q"]
    subprocess.run(pip + BASE_PACKAGES, check=True)
    # Their pinned dependencies cannot be installed together with TF 2.21 (see the
    # module docstring): the packages themselves only, their needs come from above.
    subprocess.run(pip + ["--no-deps"] + NO_DEPS_PACKAGES, check=True)
    subprocess.run(pip + ["-e", REPO], check=True)


def reverb_tests(venv, git_dir, into):
    """Copies Reverb's test files into ``into``; returns where they came from."""
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([venv_python(venv), "-m", "pip", "download", "-q",
                               "dm-reverb==0.14.0", "--no-deps", "-d", tmp],
                              capture_output=True, text=True)
        wheels = [f for f in os.listdir(tmp) if f.endswith(".whl")] if done.returncode == 0 else []
        if wheels:
            with zipfile.ZipFile(os.path.join(tmp, wheels[0])) as wheel:
                tests = [n for n in wheel.namelist() if n.endswith("_test.py")]
                if tests:
                    for name in tests:
                        target = os.path.join(into, name[len("reverb/"):])
                        os.makedirs(os.path.dirname(target), exist_ok=True)
                        with open(target, "wb") as out:
                            out.write(wheel.read(name))
                    return f"PyPI wheel {wheels[0]}"
    if not git_dir or not os.path.exists(git_dir):
        raise SystemExit(
            "The dm-reverb 0.14.0 wheel ships no test files: pass --reverb-git, a clone "
            "of github.com/google-deepmind/reverb (tag v0.14.0 is read).")
    for name in REVERB_FILES:
        text = subprocess.run(["git", "-C", git_dir, "show", f"{REVERB_TAG}:reverb/{name}"],
                              capture_output=True, check=True).stdout
        target = os.path.join(into, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as out:
            out.write(text)
    commit = subprocess.run(["git", "-C", git_dir, "rev-list", "-n1", REVERB_TAG],
                            capture_output=True, text=True).stdout.strip()
    return f"Reverb git {REVERB_TAG} ({commit[:12]})"


# --- running ---------------------------------------------------------------------------

def run_file(venv, path, work, case_timeout, file_timeout):
    """Runs one test file; returns {case id: (outcome, message)}."""
    results_path = os.path.join(work, "results-" + os.path.basename(path) + ".jsonl")
    for stale in (results_path, results_path + ".running"):
        if os.path.exists(stale):
            os.remove(stale)
    with open(path) as f:
        source = f.read()
    main_block = source.split("__name__ == '__main__'")[-1] if "__main__" in source else ""
    # An inherited PYTHONPATH comes after the shim (e.g. another shmreplay checkout).
    pythonpath = [SHIM, HERE, STUBS] + [
        p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(pythonpath),
               COMPAT_RESULTS=results_path, TF_USE_LEGACY_KERAS="1",
               TF_CPP_MIN_LOG_LEVEL="2", COMPAT_GRAPH_MODE="1" if
               "disable_eager_execution" in main_block else "0")
    deselect = []
    outcomes = {}
    log_path = results_path + ".log"
    for _attempt in range(20):
        command = [venv_python(venv), "-m", "pytest", path, "-p", "compat_plugin",
                   "-p", "no:cacheprovider", "-q", "--rootdir", work, "-o", "addopts=",
                   # native tracebacks: pytest's own re-parses source, which CPython 3.11
                   # breaks on when a finalizer runs meanwhile (INTERNALERROR)
                   "--tb=native", f"--timeout={case_timeout}", "--timeout-method=thread"]
        for case in deselect:
            command += ["--deselect", case]
        with open(log_path, "w") as log:
            try:
                done = subprocess.run(command, cwd=work, env=env, stdout=log, stderr=log,
                                      timeout=file_timeout)
                status = done.returncode
            except subprocess.TimeoutExpired:
                status = None
        outcomes.update(_read(results_path))
        running = _running(results_path)
        if not (running and running not in outcomes):
            break
        # The process ended in the middle of a case: a hang that pytest-timeout or the
        # file timeout ended, or a crash. The file runs again without the cases done.
        with open(log_path) as log:
            output = log.read()
        if status is None or "Timeout +++" in output:
            outcomes[running] = ("error", "timeout: the case did not end (hang)")
        else:
            last = [line for line in output.splitlines() if line.strip()][-1:] or [""]
            outcomes[running] = ("error", f"crash: the test process ended (status {status}) "
                                          f"in this case: {last[0][:300]}")
        deselect = sorted(outcomes)
        if os.path.exists(results_path):  # (none if no case ended before it)
            os.remove(results_path)
    return {_case_id(path, nodeid): value for nodeid, value in outcomes.items()}


def _read(results_path):
    outcomes = {}
    if os.path.exists(results_path):
        with open(results_path) as f:
            for line in f:
                entry = json.loads(line)
                previous = outcomes.get(entry["id"])
                if previous is None or previous[0] == "passed":  # a teardown error counts
                    outcomes[entry["id"]] = (entry["outcome"], entry["message"])
    return outcomes


def _running(results_path):
    try:
        with open(results_path + ".running") as f:
            return f.read().strip()
    except FileNotFoundError:
        return None


def _case_id(path, nodeid):
    return os.path.basename(path) + "::" + nodeid.split("::", 1)[-1] if "::" in nodeid \
        else os.path.basename(path)


# --- report ----------------------------------------------------------------------------

def summarize(per_file):
    files = {}
    total = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    failing = []
    for (suite, name), outcomes in per_file.items():
        counts = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
        for case, (outcome, message) in sorted(outcomes.items()):
            counts[outcome] += 1
            if outcome in ("failed", "error"):
                category, why = classify(name, case, message)
                failing.append({"suite": suite, "file": name, "case": case,
                                "outcome": outcome, "message": message,
                                "class": category, "why": why})
        files[f"{suite}/{name}"] = counts
        for key in total:
            total[key] += counts[key]
    by_class = {}
    for case in failing:
        by_class[case["class"]] = by_class.get(case["class"], 0) + 1
    return {"files": files, "total": total, "failing_by_class": by_class, "failing": failing}


def write_report(summary, meta, json_path, md_path):
    with open(json_path, "w") as f:
        json.dump(dict(meta, **summary), f, indent=1)
    lines = ["# Reverb, Acme and TF-Agents tests on shmreplay", "",
             f"Run {meta['date']} on commit {meta['commit']} ({meta['machine']}); Reverb's "
             f"tests from {meta['reverb_tests']}. Repeat with `python benchmarks/compat/run.py`.",
             "", "| file | passed | failed | error | skipped |", "| --- | --- | --- | --- | --- |"]
    for name, c in summary["files"].items():
        lines.append(f"| {name} | {c['passed']} | {c['failed']} | {c['error']} | {c['skipped']} |")
    t = summary["total"]
    lines.append(f"| **total** | **{t['passed']}** | **{t['failed']}** | **{t['error']}** | "
                 f"**{t['skipped']}** |")
    lines += ["", "Failing cases by class: " + ", ".join(
        f"{k}: {v}" for k, v in sorted(summary["failing_by_class"].items())) or "none", ""]
    for category in ("gap", "issue 19", "C++ internals"):
        cases = [c for c in summary["failing"] if c["class"] == category]
        if not cases:
            continue
        lines += [f"## {category} ({len(cases)})", ""]
        for c in cases:
            message = c["message"].replace("|", "\\|").replace("\n", " ")
            why = f" — {c['why']}" if c.get("why") else ""
            lines.append(f"- `{c['suite']}/{c['case']}` ({c['outcome']}): {message}{why}")
        lines.append("")
    with open(md_path, "w") as f:
        f.write("\n".join(lines))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", default="/work/compat-venv")
    parser.add_argument("--reverb-git", default="/work/.mirror/google-deepmind+reverb/repo")
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "shmreplay-compat"))
    parser.add_argument("--only", action="append", default=[],
                        help="a suite (reverb, acme, tf_agents) or a file name; repeatable")
    parser.add_argument("--skip-setup", action="store_true", help="use the venv as it is")
    parser.add_argument("--case-timeout", type=int, default=120)
    parser.add_argument("--file-timeout", type=int, default=900)
    parser.add_argument("--json", default=os.path.join(RESULTS, "compat.json"))
    parser.add_argument("--md", default=os.path.join(RESULTS, "compat.md"))
    parser.add_argument("--reclassify", action="store_true",
                        help="only classify the failing cases of --json again (known.json "
                             "changed) and rewrite --json and --md")
    args = parser.parse_args()
    if args.reclassify:
        with open(args.json) as f:
            report = json.load(f)
        by_class = {}
        for case in report["failing"]:
            case["class"], case["why"] = classify(case["file"], case["case"], case["message"])
            by_class[case["class"]] = by_class.get(case["class"], 0) + 1
        report["failing_by_class"] = by_class
        meta = {k: report[k] for k in ("date", "commit", "machine", "reverb_tests", "only")}
        summary = {k: report[k] for k in ("files", "total", "failing_by_class", "failing")}
        write_report(summary, meta, args.json, args.md)
        print(f"failing by class {by_class}")
        return

    if not args.skip_setup or not os.path.exists(venv_python(args.venv)):
        set_up(args.venv)
    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.join(work, "reverb_tests"))
    source = reverb_tests(args.venv, args.reverb_git, os.path.join(work, "reverb_tests"))
    site = subprocess.run([venv_python(args.venv), "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    suites = ([("reverb", os.path.join(work, "reverb_tests", f)) for f in REVERB_FILES]
              + [("acme", os.path.join(site, f)) for f in ACME_FILES]
              + [("tf_agents", os.path.join(site, f)) for f in TF_AGENTS_FILES])
    if args.only:
        suites = [(s, p) for s, p in suites
                  if s in args.only or os.path.basename(p) in args.only]
    # Compile shmreplay's kernels first (once for the venv's numba cache): a cold compile
    # on a busy machine takes minutes, which the first case's timeout would count.
    subprocess.run([venv_python(args.venv), "-c", "import shmreplay; shmreplay.warm_up()"],
                   env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                       [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
                       + [REPO])), check=True)
    per_file = {}
    for suite, path in suites:
        started = datetime.datetime.now()
        per_file[(suite, os.path.basename(path))] = run_file(
            args.venv, path, work, args.case_timeout, args.file_timeout)
        counts = {}
        for outcome, _ in per_file[(suite, os.path.basename(path))].values():
            counts[outcome] = counts.get(outcome, 0) + 1
        print(f"{suite}/{os.path.basename(path)}: {counts} "
              f"({(datetime.datetime.now() - started).seconds}s)", flush=True)
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "shmreplay"],
                           capture_output=True, text=True).stdout.strip()
    tested = subprocess.run(  # the shmreplay the tests imported (PYTHONPATH may point away)
        [venv_python(args.venv), "-c", "import os, shmreplay; "
         "print(os.path.dirname(os.path.dirname(os.path.abspath(shmreplay.__file__))))"],
        capture_output=True, text=True, cwd=work).stdout.strip()
    if os.path.realpath(tested) != os.path.realpath(REPO):
        commit, dirty = f"shmreplay from {tested}, not this checkout", ""
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": commit + ("+changes" if dirty else ""),
            "machine": f"{os.cpu_count()} cores, Python {sys.version.split()[0]}",
            "reverb_tests": source, "only": args.only}
    summary = summarize(per_file)
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    write_report(summary, meta, args.json, args.md)
    t = summary["total"]
    print(f"compat: {t['passed']} passed, {t['failed']} failed, {t['error']} errors, "
          f"{t['skipped']} skipped; failing by class {summary['failing_by_class']}")
    print(f"wrote {args.json} and {args.md}")


if __name__ == "__main__":
    main()
