"""The performance page's table of Acme's adders per environment step
(``bench_writers.py --libs acme``: shmreplay, Reverb, and the same adders over a writer
that does nothing)."""

from _perf_format import md as _md

ADDERS = (("acme_nstep", "`NStepTransitionAdder`"), ("acme_sequence", "`SequenceAdder`"))


def acme_step_us(data, backend, dataset, case):
    """µs per environment step of one adder on one backend (``null``: Acme alone)."""
    return data["acme_adders"][backend]["datasets"][dataset]["cases"][case]["median_us"]


def acme_adders(files):
    (name, data), = files
    rows = []
    for dataset in ("small", "frames"):
        for case, label in ADDERS:
            ours, reverb, alone = (acme_step_us(data, b, dataset, case)
                                   for b in ("shmreplay", "reverb", "null"))
            rows.append([f"{label}, {dataset}", f"{ours:.1f}", f"{reverb:.1f}",
                         f"**{reverb / ours:.2f}x**", f"{alone:.1f}", f"{ours - alone:.1f}",
                         f"{reverb - alone:.1f}"])
    return _md(["µs per environment step", "shmreplay", "Reverb", "Reverb ÷ shmreplay",
                "Acme alone", "shmreplay − Acme alone", "Reverb − Acme alone"], rows,
               ["---", "---:", "---:", "---:", "---:", "---:", "---:"])


ACME_TABLES = {"acme_adders": acme_adders}
