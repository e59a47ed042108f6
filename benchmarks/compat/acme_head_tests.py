"""Acme's CURRENT adder tests (acme/adders/reverb/*_test.py at the Acme mirror's HEAD,
with the adders of that commit) on DeepMind's Reverb or on shmreplay.

    /work/reverb-venv/bin/python benchmarks/compat/acme_head_tests.py --backend reverb
    PYTHONPATH=$PWD /work/compat-venv/bin/python benchmarks/compat/acme_head_tests.py \
        --backend shmreplay

Why: acme 0.4.0's adders (and so its tests, which run.py runs) call
``Client.trajectory_writer(get_signature_timeout_ms=...)``, which dm-reverb 0.14.0 does
not take, so on real Reverb 0.14.0 only 3 of their 45 cases pass; Acme's current adders
and tests (which add ``structured_test.py``, the StructuredAdder's) run on it. The
files are written to a work directory: the adders where ``acme.adders.__path__`` finds
them first (a conftest puts them there), the tests beside the conftest. Each file runs
in its own pytest process with this Python; prints and writes (``--json``) the counts.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
FILES = ["episode_test.py", "sequence_test.py", "transition_test.py", "structured_test.py"]
CONFTEST = '''# Acme HEAD's acme/adders/reverb ahead of the installed acme's.
import os
import acme.adders
acme.adders.__path__.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)),
                                            "adders"))
'''


def write_sources(git_dir, work):
    """Acme HEAD's acme/adders/reverb into ``work``; returns the commit."""
    names = subprocess.run(["git", "-C", git_dir, "ls-tree", "--name-only", "HEAD",
                            "acme/adders/reverb/"], capture_output=True, text=True,
                           check=True).stdout.split()
    os.makedirs(os.path.join(work, "adders", "reverb"))
    os.makedirs(os.path.join(work, "tests"))
    for name in names:
        base = os.path.basename(name)
        # Tests apart from the package: pytest would otherwise import the folder
        # `reverb` as the top-level module of that name.
        folder = "tests" if base.endswith("_test.py") else os.path.join("adders", "reverb")
        text = subprocess.run(["git", "-C", git_dir, "show", f"HEAD:{name}"],
                              capture_output=True, check=True).stdout
        with open(os.path.join(work, folder, base), "wb") as f:
            f.write(text)
    with open(os.path.join(work, "tests", "conftest.py"), "w") as f:
        f.write(CONFTEST)
    return subprocess.run(["git", "-C", git_dir, "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()


def run_file(work, name, backend):
    paths = ([os.path.join(HERE, "shim")] if backend == "shmreplay" else []) + [
        os.path.join(HERE, "stubs")] + [p for p in os.environ.get("PYTHONPATH", "").split(
            os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths), TF_USE_LEGACY_KERAS="1",
               TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf",
         "--rootdir", os.path.join(work, "tests"), "-o", "addopts=", "-W", "ignore",
         "--timeout=120", os.path.join(work, "tests", name)],
        cwd=work, env=env, capture_output=True, text=True, timeout=900)
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|error|skipped)",
                                               done.stdout.splitlines()[-1] if done.stdout
                                               else "")}
    failing = [line[len("FAILED "):][:300] for line in done.stdout.splitlines()
               if line.startswith("FAILED ")]
    return {"counts": counts, "failing": failing}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["reverb", "shmreplay"], required=True)
    parser.add_argument("--acme-git", default="/work/.mirror/google-deepmind+acme/repo")
    parser.add_argument("--json", help="write the counts and failing cases here")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="acme-head-tests-")
    commit = write_sources(args.acme_git, work)
    out = {"backend": args.backend, "acme_commit": commit, "files": {}}
    for name in FILES:
        out["files"][name] = run_file(work, name, args.backend)
        print(f"{name}: {out['files'][name]['counts']}", flush=True)
        for case in out["files"][name]["failing"]:
            print(f"  FAILED {case}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
