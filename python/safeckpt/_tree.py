"""Turns the native value tree into Python objects, without recursion.

Node tuples come from _Checkpoint.nodes(): (kind, i, flag, re, im, text,
items, attrs). Shared nodes (the pickle memo) become one shared Python
object, as pickle makes them; lists and dicts are created empty before their
items, so a list that contains itself is the same cycle in Python. A cycle
through an immutable value (tuple, frozenset, set, slice, object arguments)
cannot be built bottom-up and is refused as malformed.
"""
import collections

from ._errors import MalformedCheckpointError, UnsupportedCheckpointError

# Kind numbers: include/safeckpt/value.hpp, in enum order.
(K_NONE, K_BOOL, K_INT, K_BIGINT, K_FLOAT, K_COMPLEX, K_STR, K_BYTES, K_BYTEARRAY, K_LIST, K_TUPLE, K_SET,
 K_FROZENSET, K_SLICE, K_DICT, K_ODICT, K_COUNTER, K_SIZE, K_DTYPE, K_DEVICE, K_LAYOUT, K_QSCHEME, K_TENSOR,
 K_STORAGE, K_GLOBAL, K_OBJECT) = range(26)

_MUTABLE = (K_LIST, K_DICT, K_ODICT, K_COUNTER)


class GlobalRef:
    """An allowlisted global used as a value (a class or function object in
    the pickle) that was allowlisted by name only: nothing is imported to
    resolve it. Register the object itself (add_safe_globals([cls])) to get
    the object back instead."""

    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"safeckpt.GlobalRef({self.name!r})"

    def __eq__(self, other):
        return isinstance(other, GlobalRef) and other.name == self.name

    def __hash__(self):
        return hash(("GlobalRef", self.name))


class SafeGlobalObject:
    """A call of an allowlisted global that safeckpt does not rebuild
    (e.g. argparse.Namespace with --allow argparse): ``name`` is the global,
    ``args`` what the file passed to it (a tuple or None) and ``state`` what
    BUILD set (usually a dict, or None). The class is never called: the file
    chose those arguments. Rebuild it yourself if you trust it, e.g.
    ``argparse.Namespace(**obj.state)``."""

    __slots__ = ("name", "args", "state")

    def __init__(self, name, args, state):
        self.name = name
        self.args = args
        self.state = state

    def __repr__(self):
        return f"safeckpt.SafeGlobalObject({self.name!r}, args={self.args!r}, state={self.state!r})"


def _children(node):
    kind, _i, _flag, _re, _im, _text, items, attrs = node
    out = [c for c in items if c >= 0]
    if attrs >= 0:
        out.append(attrs)
    return out


def build(nodes, root, tensor_of, storage_of, scalars):
    """Python object for node ``root``. ``tensor_of(index, value_of)`` and
    ``storage_of(index)`` make tensors and bare storages; ``scalars`` maps
    dtype/device/layout/qscheme/size/global nodes (see _api.py)."""
    n = len(nodes)
    out = [None] * n
    state = bytearray(n)  # 0 new, 1 in progress, 2 done
    stack = [(root, False)]
    while stack:
        nid, finish = stack.pop()
        node = nodes[nid]
        kind = node[0]
        if not finish:
            if state[nid]:
                continue
            state[nid] = 1
            if kind == K_LIST:
                out[nid] = []
            elif kind == K_DICT:
                out[nid] = {}
            elif kind == K_ODICT:
                out[nid] = collections.OrderedDict()
            elif kind == K_COUNTER:
                out[nid] = collections.Counter()
            deps = _children(node)
            if kind == K_TENSOR:
                deps = list(scalars.tensor_deps(node[1]))
            stack.append((nid, True))
            for c in reversed(deps):
                if not state[c]:
                    stack.append((c, False))
            continue
        # finish: every child is done, or an in-progress mutable placeholder.
        for c in (scalars.tensor_deps(node[1]) if kind == K_TENSOR else _children(node)):
            if state[c] != 2 and nodes[c][0] not in _MUTABLE:
                raise MalformedCheckpointError(f"a cycle through an immutable value ({_kind_label(nodes[c][0])}) "
                                               "cannot be built", code="malformed")
        if kind in (K_TENSOR, K_STORAGE):  # their errors (a map_location callable's included) pass as they are
            out[nid] = _finish(node, nid, out, tensor_of, storage_of, scalars)
        else:
            try:
                out[nid] = _finish(node, nid, out, tensor_of, storage_of, scalars)
            except TypeError as e:  # unhashable key or set member: pickle fails the same way
                raise MalformedCheckpointError(f"value node {nid}: {e}", code="malformed") from None
        state[nid] = 2
    return out[root]


def _kind_label(kind):
    return {K_TUPLE: "tuple", K_SET: "set", K_FROZENSET: "frozenset", K_SLICE: "slice", K_OBJECT: "object",
            K_TENSOR: "tensor", K_SIZE: "torch.Size"}.get(kind, str(kind))


def _get(out, c):
    return None if c < 0 else out[c]


def _finish(node, nid, out, tensor_of, storage_of, scalars):
    kind, i, flag, re, im, text, items, attrs = node
    if kind == K_NONE:
        return None
    if kind == K_BOOL:
        return bool(flag)
    if kind == K_INT:
        return int(i)
    if kind == K_BIGINT:
        return int(text)
    if kind == K_FLOAT:
        return float(re)
    if kind == K_COMPLEX:
        return complex(re, im)
    if kind == K_STR:
        return text
    if kind == K_BYTES:
        return bytes(text)
    if kind == K_BYTEARRAY:
        return bytearray(text)
    if kind == K_LIST:
        obj = out[nid]
        obj.extend(out[c] for c in items)
        return obj
    if kind in (K_DICT, K_ODICT, K_COUNTER):
        obj = out[nid]
        for k in range(0, len(items) - 1, 2):
            obj[out[items[k]]] = out[items[k + 1]]
        if attrs >= 0 and isinstance(out[attrs], dict):
            for key, value in out[attrs].items():
                if isinstance(key, str):
                    setattr(obj, key, value)
        return obj
    if kind == K_TUPLE:
        return tuple(out[c] for c in items)
    if kind == K_SET:
        return set(out[c] for c in items)
    if kind == K_FROZENSET:
        return frozenset(out[c] for c in items)
    if kind == K_SLICE:
        return slice(*(out[c] for c in items))
    if kind == K_SIZE:
        return scalars.size(tuple(out[c] for c in items))
    if kind == K_DTYPE:
        return scalars.dtype(i)
    if kind == K_DEVICE:
        return scalars.device(text)
    if kind == K_LAYOUT:
        return scalars.layout(text)
    if kind == K_QSCHEME:
        return scalars.qscheme(text)
    if kind == K_TENSOR:
        return tensor_of(i, out)
    if kind == K_STORAGE:
        return storage_of(i)
    if kind == K_GLOBAL:
        return scalars.global_value(text)
    if kind == K_OBJECT:
        args = _get(out, items[0]) if len(items) > 0 else None
        st = _get(out, items[1]) if len(items) > 1 else None
        return SafeGlobalObject(text, args, st)
    raise UnsupportedCheckpointError(f"value node {nid}: unknown kind {kind}", code="unsupported")
