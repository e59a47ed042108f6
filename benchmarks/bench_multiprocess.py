#!/usr/bin/env python
"""Multi-process throughput: actors inserting one transition per call while a learner
samples prioritized batches of 256 and updates their priorities.

shmreplay: the parent creates a Server with one table
``Table("replay", Prioritized(0.4), Fifo(), capacity, MinSize(1))`` and fills it with
``insert_batch``. Actor processes (``multiprocessing`` spawn) attach by name with
``shmreplay.Client(name)`` and loop ``client.insert(transition, {"replay": 1.0})``; the
learner process (spawn) attaches the same way and loops
``s = client.sample_batch("replay", 256)``, ``s.info.importance_weights(0.4)``,
``client.update_priorities("replay", s.info.key, prios)``.

cpprb peer: ``MPPrioritizedReplayBuffer(capacity, env_dict, alpha=0.4)`` (fork context,
default shared-memory backend), filled first; explorer processes loop ``rb.add(**transition)``
(no explicit priority: cpprb's fastest path), the learner loops
``rb.sample(256, beta=0.4)`` + ``rb.update_priorities(indexes, prios)``. The whole cpprb
case runs inside a forked driver process so its shared memory is released afterwards.

Every worker attaches and warms up (numba compiles) first; then all start together and run
for ``--seconds`` of wall time; each reports its count and its own elapsed time.

Transitions: "small" = obs/next_obs float32[15], act float32[3], rew, done float32
(capacity 2**16); "frames" = obs/next_obs uint8[84,84,4], act int32, rew, done float32
(capacity 2**14, about 0.9 GiB per buffer).

Targets (issue 2): one actor's single-transition insert rate with the learner running
>= 20x cpprb's; the learner > 1M items/s sampled+updated.

The code: this script parses the arguments, runs the cases and reports;
``_multiprocess_cases.py`` runs one case (its processes, its rates),
``_multiprocess_ops.py`` is what each worker process runs.

Usage:  python benchmarks/bench_multiprocess.py [--quick] [--seconds 5]
            [--kinds small,frames] [--libs cpprb,shmreplay] [--no-reference]
Writes: benchmarks/results/multiprocess[-quick].{json,md}
"""

import argparse
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402
from _multiprocess_cases import cpprb_case, plan, shm_case  # noqa: E402
from _multiprocess_ops import ALPHA, BATCH, BETA, CAPACITY  # noqa: E402

TARGET_INSERT_RATIO = 20.0
TARGET_LEARNER = 1e6
# What issue 2 quotes for cpprb's MPPrioritizedReplayBuffer (1 explorer adding one transition
# per call while the learner runs), measured earlier on this machine class.
ISSUE_CPPRB = {"insert": 5.3e3, "learner": 400e3}


def run(args):
    seconds = args.seconds if args.seconds is not None else (1.0 if args.quick else 5.0)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    libs = [s.strip() for s in args.libs.split(",") if s.strip()]
    errors = []
    shm = None
    if "shmreplay" in libs:
        shm, why = C.load_shmreplay()
        if shm is None:
            print("shmreplay unavailable:", why)
            errors.append({"lib": "shmreplay", "where": "import", "error": why})
            libs.remove("shmreplay")
    if "cpprb" in libs:
        cpprb, why = C.load_cpprb()
        if cpprb is None:
            print("cpprb unavailable:", why)
            errors.append({"lib": "cpprb", "where": "import", "error": why})
            libs.remove("cpprb")
    info = C.machine_info()
    for ln in C.machine_lines(info):
        print(ln)
    print(f"mode: {'quick' if args.quick else 'full'}; {seconds:g} s per case; "
          f"learner batch {BATCH}, alpha {ALPHA}, beta {BETA}\n")

    results = []
    for lib, kind, n_actors, learner in plan(kinds, libs, not args.no_reference):
        label = f"{lib:9s} {kind:6s} actors={n_actors} learner={'yes' if learner else 'no '}"
        print("  " + label, end=" ... ", flush=True)
        try:
            if lib == "cpprb":
                r = cpprb_case(kind, n_actors, learner, seconds, args.seed)
            else:
                r = shm_case(shm, kind, n_actors, learner, seconds, args.seed)
            results.append(r)
            print(f"insert/actor {C.fmt_num(r['insert_per_actor_mean'])}/s, "
                  f"learner {C.fmt_num(r['learner_items_s'])} items/s "
                  f"(startup {r['startup_s']:.1f}s)", flush=True)
        except Exception as exc:  # noqa: BLE001 - report, never work around
            tb = traceback.format_exc()
            print("FAILED\n" + tb, flush=True)
            errors.append({"lib": lib, "where": f"{kind} actors={n_actors} learner={learner}",
                           "error": repr(exc), "traceback": tb})

    headers = ["lib", "transition", "actors", "learner", "inserts/s per actor", "µs per insert",
               "inserts/s total", "learner items/s", "learner calls/s"]
    rows = []
    for r in results:
        per = r["insert_per_actor_mean"]
        rows.append([r["lib"], f"{r['kind']} (cap {r['capacity']})", r["actors"],
                     "yes" if r["learner"] else "no", C.fmt_num(per),
                     C.fmt_num(1e6 / per if per else None, 1), C.fmt_num(r["insert_total"]),
                     C.fmt_num(r["learner_items_s"]), C.fmt_num(r["learner_calls_s"])])

    def find(lib, kind, actors, learner):
        for r in results:
            if (r["lib"], r["kind"], r["actors"], r["learner"]) == (lib, kind, actors, learner):
                return r
        return None

    comp_headers = ["comparison", "shmreplay", "cpprb", "ratio", "target", "met"]
    comp = []
    for kind in kinds:
        s, c = find("shmreplay", kind, 1, True), find("cpprb", kind, 1, True)
        si = s and s["insert_per_actor_mean"]
        ci = c and c["insert_per_actor_mean"]
        ratio = si / ci if si and ci else None
        tgt = TARGET_INSERT_RATIO if kind == "small" else None
        comp.append([f"{kind}: inserts/s, 1 actor + learner", C.fmt_num(si), C.fmt_num(ci),
                     C.fmt_ratio(ratio), f">= {tgt:g}x" if tgt else "-",
                     ("yes" if ratio >= tgt else "NO") if (tgt and ratio) else "-"])
        if kind == "small" and si:
            q = si / ISSUE_CPPRB["insert"]
            comp.append(["small: inserts/s vs the issue's quoted cpprb 5.3k/s", C.fmt_num(si),
                         C.fmt_num(ISSUE_CPPRB["insert"]), C.fmt_ratio(q), f">= {tgt:g}x",
                         "yes" if q >= tgt else "NO"])
        sl, cl = s and s["learner_items_s"], c and c["learner_items_s"]
        lratio = sl / cl if sl and cl else None
        comp.append([f"{kind}: learner items/s, 1 actor running", C.fmt_num(sl), C.fmt_num(cl),
                     C.fmt_ratio(lratio), "> 1M/s" if kind == "small" else "-",
                     ("yes" if sl > TARGET_LEARNER else "NO") if (sl and kind == "small")
                     else "-"])
        s2 = find("shmreplay", kind, 2, True)
        if s2:
            comp.append([f"{kind}: 2 actors + learner (per actor / learner)",
                         f"{C.fmt_num(s2['insert_per_actor_mean'])} / "
                         f"{C.fmt_num(s2['learner_items_s'])}", "-", "-", "-", "-"])

    print()
    print(C.render_table(headers, rows))
    print()
    print(C.render_table(comp_headers, comp))
    notes = [f"mode: {'quick' if args.quick else 'full'}; {seconds:g} s wall time per case, "
             "all workers started together after warm-up",
             f"prioritized table, alpha {ALPHA}; learner: sample {BATCH} + importance weights "
             f"(beta {BETA}) + update_priorities",
             "shmreplay: Server in the parent, spawned workers attach with Client(name); "
             "cpprb: MPPrioritizedReplayBuffer, fork context",
             f"{info['cores_usable']} usable cores: runs with more than "
             f"{info['cores_usable']} busy processes are oversubscribed"]
    md = C.markdown_header("Multi-process: actors insert one transition per call, "
                           "learner samples 256 + updates", info, notes)
    md += "\n" + C.render_table(headers, rows, markdown=True) + "\n\n"
    md += C.render_table(comp_headers, comp, markdown=True) + "\n"
    if errors:
        md += "\nErrors:\n\n" + "\n".join(f"- {e['lib']} {e['where']}: `{e['error']}`"
                                          for e in errors) + "\n"
    payload = {"benchmark": "multiprocess", "quick": args.quick, "machine": info,
               "config": {"seconds": seconds, "batch": BATCH, "alpha": ALPHA, "beta": BETA,
                          "capacity": CAPACITY, "kinds": kinds, "seed": args.seed},
               "results": results, "comparison": [dict(zip(comp_headers, r)) for r in comp],
               "errors": errors}
    paths = C.write_results("multiprocess" + ("-quick" if args.quick else ""), payload, md)
    print("\nwrote", ", ".join(os.path.relpath(p, C.REPO_ROOT) for p in paths))
    left = C.check_clean()
    return 1 if (errors or left) else 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1 s per case instead of 5")
    p.add_argument("--seconds", type=float, default=None, help="wall time per case")
    p.add_argument("--kinds", default="small,frames", help="small,frames")
    p.add_argument("--libs", default="cpprb,shmreplay", help="cpprb,shmreplay")
    p.add_argument("--no-reference", action="store_true",
                   help="skip the learner-only and actor-only reference runs")
    p.add_argument("--seed", type=int, default=0)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
