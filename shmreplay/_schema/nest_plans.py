"""Flattening plans: a nest's leaves read by code made for its structure.

``optree.tree_flatten`` walks any nest, and then the caller still has to compare the
treedef with the one it expects. A plan is made once per structure (container types,
dict keys, namedtuple class, list and tuple lengths) and does both at once: it returns
the leaves, in optree's order, of data of exactly that structure, and None for anything
else. The insert fast path (``fast_leaves``) and both writers' ``append`` use plans, so
a nest of any of these shapes costs about what a flat dict does.

A plan checks containers only: whatever sits where the structure has a leaf is returned
as a leaf (the callers check leaves themselves, and refuse containers there).
"""

import optree

_K = optree.PyTreeKind
_SEQUENCES = {_K.TUPLE: tuple, _K.LIST: list}
_MAX_PLANS = 16  # per cache; more structures than this are flattened as before


def plan_for(treedef):
    """A function ``data -> leaves or None`` for nests of ``treedef``'s structure, or
    None when it has nodes a plan does not read (None, OrderedDict, defaultdict, deque,
    structseq, registered custom nodes): such data is flattened as before."""
    lines = []
    names = {"K": [], "T": []}
    try:
        leaves = _emit(treedef, "d", lines, names, [0])
    except _Unplannable:
        return None
    source = ["def plan(d):", "    try:"]
    source += ["        " + line for line in lines]
    source.append(f"        return [{', '.join(leaves)}]")
    source += ["    except (KeyError, TypeError):", "        return None"]
    namespace = {"K": tuple(names["K"]), "T": tuple(names["T"]),
                 "tuple": tuple, "list": list, "dict": dict}
    exec("\n".join(source), namespace)  # noqa: S102 - code made here, from a treedef
    return namespace["plan"]


class _Unplannable(Exception):
    pass


def _emit(node, var, lines, names, counter):
    """Appends the checks of ``node`` (held in ``var``) to ``lines``; returns its leaves'
    expressions in optree's order."""
    kind = node.kind
    if kind == _K.LEAF:
        return [var]
    children = node.children()
    if kind == _K.DICT:
        lines.append(f"if type({var}) is not dict or len({var}) != {len(children)}: return None")
        parts = []
        for key in optree.treespec_entries(node):
            names["K"].append(key)
            parts.append(f"{var}[K[{len(names['K']) - 1}]]")
    elif kind in _SEQUENCES:
        name = _SEQUENCES[kind].__name__
        lines.append(f"if type({var}) is not {name} or len({var}) != {len(children)}: "
                     "return None")
        parts = [f"{var}[{i}]" for i in range(len(children))]
    elif kind == _K.NAMEDTUPLE:
        names["T"].append(node.type)  # (the exact class: its length comes with it)
        lines.append(f"if type({var}) is not T[{len(names['T']) - 1}]: return None")
        parts = [f"{var}[{i}]" for i in range(len(children))]
    else:
        raise _Unplannable(kind)
    leaves = []
    for child, part in zip(children, parts):
        if child.kind == _K.LEAF:
            leaves.append(part)
            continue
        counter[0] += 1
        child_var = f"v{counter[0]}"
        lines.append(f"{child_var} = {part}")
        leaves += _emit(child, child_var, lines, names, counter)
    return leaves


def builder_for(treedef):
    """The inverse of a plan: a function ``leaves -> nest`` of ``treedef``'s structure
    (what ``optree.tree_unflatten(treedef, leaves)`` returns, dict keys in its order, in
    a fraction of its time), or None for nodes a plan does not read either."""
    probe = optree.tree_unflatten(treedef, list(range(treedef.num_leaves)))
    names = {"K": [], "T": []}
    try:
        expression = _build(probe, names)
    except _Unplannable:
        return None
    namespace = {"K": tuple(names["K"]), "T": tuple(names["T"])}
    exec(f"def build(l):\n    return {expression}", namespace)  # noqa: S102 (see plan_for)
    build = namespace["build"]
    if not _same(build(list(range(treedef.num_leaves))), probe):
        return None
    return build


def _build(node, names):
    """The expression that builds ``node``, a nest whose leaves are their positions."""
    kind = type(node)
    if kind is int:
        return f"l[{node}]"
    if kind is dict:
        items = []
        for key, child in node.items():
            names["K"].append(key)
            items.append(f"K[{len(names['K']) - 1}]: {_build(child, names)}")
        return "{" + ", ".join(items) + "}"
    if kind is list:
        return "[" + ", ".join(_build(child, names) for child in node) + "]"
    if kind is tuple:
        return "(" + "".join(_build(child, names) + ", " for child in node) + ")"
    if isinstance(node, tuple) and hasattr(kind, "_fields"):  # a namedtuple
        names["T"].append(kind)
        return (f"T[{len(names['T']) - 1}](" + ", ".join(_build(child, names) for child in node)
                + ")")
    raise _Unplannable(kind)


def _same(a, b) -> bool:
    """Whether two nests are the same: types, dict key order and leaves."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def checked_plan(data, leaves, treedef):
    """``plan_for(treedef)`` if it reads ``data`` (which flattened to ``leaves``,
    ``treedef``) as optree did, else None."""
    plan = plan_for(treedef)
    if plan is None:
        return None
    got = plan(data)
    if got is None or len(got) != len(leaves) or any(a is not b for a, b in zip(got, leaves)):
        return None
    return plan


class PlanCache:
    """Plans by the type of the nest's root, each with what the owner decided about
    its structure (``accept(treedef, leaves)``, asked once per structure)."""

    __slots__ = ("by_type", "refused", "count")

    def __init__(self):
        self.by_type = {}     # root type -> [(plan, verdict)]
        self.refused = set()  # treedefs without a plan (or too many plans)
        self.count = 0

    def find(self, data):
        """``(leaves, verdict)`` for data of a known structure, else None."""
        entries = self.by_type.get(type(data))
        if entries is not None:
            for plan, verdict in entries:
                leaves = plan(data)
                if leaves is not None:
                    return leaves, verdict
        return None

    def learn(self, data, verdict_of):
        """Flattens ``data`` and remembers a plan for its structure with
        ``verdict_of(treedef, leaves)``; returns ``(leaves, verdict)``, or None when no
        plan can read it (its verdict is then not asked)."""
        leaves, treedef = optree.tree_flatten(data, none_is_leaf=False)
        if treedef in self.refused:
            return None
        plan = checked_plan(data, leaves, treedef) if self.count < _MAX_PLANS else None
        if plan is None:
            if len(self.refused) > 256:
                self.refused.clear()
            self.refused.add(treedef)
            return None
        verdict = verdict_of(treedef, leaves)
        self.by_type.setdefault(type(data), []).append((plan, verdict))
        self.count += 1
        return leaves, verdict
