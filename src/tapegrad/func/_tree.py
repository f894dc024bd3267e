"""Minimal pytrees: nested tuples, lists and dicts with anything else as leaves."""


def flatten(tree):
    """``(leaves, spec)``; ``unflatten(leaves, spec)`` rebuilds ``tree``."""
    leaves = []

    def go(t):
        if isinstance(t, (tuple, list)):
            return (type(t), [go(x) for x in t])
        if isinstance(t, dict):
            return (dict, [(k, go(v)) for k, v in t.items()])
        leaves.append(t)
        return None

    return leaves, go(tree)


def unflatten(leaves, spec):
    it = iter(leaves)

    def go(s):
        if s is None:
            return next(it)
        kind, children = s
        if kind is dict:
            return {k: go(c) for k, c in children}
        items = [go(c) for c in children]
        if kind is list:
            return items
        if kind is tuple:
            return tuple(items)
        return kind(*items)  # a namedtuple

    return go(spec)


def tree_map(fn, tree):
    leaves, spec = flatten(tree)
    return unflatten([fn(x) for x in leaves], spec)


def broadcast_prefix(prefix, tree, name):
    """The leaves of ``prefix`` (an in_dims/out_dims spec) repeated to match ``tree``'s."""
    if not isinstance(prefix, (tuple, list, dict)):
        return [prefix] * len(flatten(tree)[0])
    if isinstance(prefix, dict):
        if not isinstance(tree, dict) or set(prefix) != set(tree):
            raise ValueError(f"{name}: the dict structure does not match the inputs")
        out = []
        for k in tree:
            out += broadcast_prefix(prefix[k], tree[k], name)
        return out
    if not isinstance(tree, (tuple, list)) or len(prefix) != len(tree):
        length = f" of length {len(tree)}" if isinstance(tree, (tuple, list)) else ""
        raise ValueError(f"{name}: expected a structure of length {len(prefix)} matching the "
                         f"inputs, got {type(tree).__name__}{length}")
    out = []
    for p, t in zip(prefix, tree):
        out += broadcast_prefix(p, t, name)
    return out
