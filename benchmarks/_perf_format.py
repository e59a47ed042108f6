"""Formatting helpers shared by the performance page's table generators."""


def num(x, digits=2):
    return "-" if x is None else f"{x:,.{digits}f}"


def rate(x):
    """items/s as the page writes them: 142.9k, 7.98M."""
    if x is None:
        return "-"
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}"


def md(headers, rows, align=None):
    align = align or ["---"] + ["---:"] * (len(headers) - 1)
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join(align) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def pick(rows, **want):
    for row in rows:
        if all(row.get(k) == v for k, v in want.items()):
            return row
    return None


def writer_cases(data, kind):
    """``{case: result}`` of a writers run for one step kind, Reverb's cases included
    (``bench_writers.py`` records those under ``reverb.datasets``)."""
    cases = dict(data["results"].get(kind, {}).get("cases", {}))
    reverb = (data.get("reverb") or {}).get("datasets") or {}
    cases.update(reverb.get(kind, {}).get("cases", {}))
    return cases
