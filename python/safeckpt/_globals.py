"""Process-wide safe globals, with the meaning of torch.serialization's.

``add_safe_globals([...])`` extends PyTorch's default weights-only set (the
C++ default policy, allowlist/default.allow) for every later load; names are
strings ("mypkg.MyClass") or the Python classes/functions themselves (their
``__module__`` + ``__qualname__``), or torch's ``(obj, "module.name")`` pairs.
Nothing is imported to resolve a string. A hard-blocked name (os.system,
builtins.eval, torch.load, ...: docs in include/safeckpt/allowlist.hpp) is
refused with ValueError when added, as the C++ Allowlist::add refuses it.

What an allowlisted global becomes in a loaded tree:
  - globals the loader models (OrderedDict, torch.Size, tensors, ...): the
    real Python value;
  - a global used as a value (a class or function object in the pickle): the
    object you registered under that name, else a ``GlobalRef(name)``;
  - a call of an allowlisted global the loader does not model (REDUCE /
    NEWOBJ / BUILD on e.g. argparse.Namespace): a ``SafeGlobalObject`` with the
    name, the call's arguments and the BUILD state, never constructed by
    calling the class (the file chose those arguments).
"""
import contextlib
import threading

from . import _safeckpt as _native
from ._errors import native_errors

_lock = threading.Lock()
# name -> the object the user registered (the name itself for strings), in order.
_user = {}
# name -> [object, count]: the names of the safe_globals blocks open now, with
# how many open blocks hold each. A name leaves when its last block exits, so
# blocks that overlap without nesting (two threads) neither drop each other's
# names early nor leave one allowed after both exited, as restoring a
# snapshot did (and torch.serialization.safe_globals does).
_scoped = {}


def _name_of(entry):
    if isinstance(entry, str):
        return entry, entry
    if isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], str):
        return entry[1], entry[0]
    module = getattr(entry, "__module__", None)
    qualname = getattr(entry, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        raise TypeError(f"safe globals are strings, classes or functions, or (object, 'module.name'); got {entry!r}")
    return f"{module}.{qualname}", entry


def _checked(entries):
    out = []
    for e in entries:
        name, obj = _name_of(e)
        with native_errors():
            _native.check_allow_name(name)
        out.append((name, obj))
    return out


def add_safe_globals(safe_globals):
    """Marks globals as safe for every later ``safeckpt.load`` (torch's
    ``torch.serialization.add_safe_globals``). Raises ValueError for a
    hard-blocked or malformed name, TypeError for an entry without a name."""
    pairs = _checked(safe_globals)
    with _lock:
        for name, obj in pairs:
            _user[name] = obj


def _merged():
    """name -> object: add_safe_globals' names, then those of open blocks (a
    block's object wins for its name while it is open). Call with _lock held."""
    names = dict(_user)
    for name, (obj, _) in _scoped.items():
        names[name] = obj
    return names


def get_safe_globals():
    """The user-added safe globals, as given (objects or strings): those of
    add_safe_globals and of the safe_globals blocks open now."""
    with _lock:
        return list(_merged().values())


def clear_safe_globals():
    """Forgets every safe global add_safe_globals added (the defaults stay;
    the names of safe_globals blocks still open leave when their blocks do)."""
    with _lock:
        _user.clear()


@contextlib.contextmanager
def safe_globals(safe_globals):
    """Context manager: the globals are safe while the block runs, for every
    load in the process (as torch's), and leave when it exits, also when it
    raises. Blocks may overlap (threads): a name stays while any block
    holding it is open, and a name add_safe_globals added stays after."""
    pairs = _checked(safe_globals)
    with _lock:
        for name, obj in pairs:
            entry = _scoped.get(name)
            if entry is None:
                _scoped[name] = [obj, 1]
            else:
                entry[0] = obj
                entry[1] += 1
    try:
        yield
    finally:
        with _lock:
            for name, _ in pairs:
                entry = _scoped[name]
                entry[1] -= 1
                if entry[1] == 0:
                    del _scoped[name]


def current(extra=None):
    """(name, handled_as) pairs for the native loader and the name -> object
    map for this call: the user-added globals plus ``extra`` (load's allow=)."""
    with _lock:
        names = _merged()
    if extra:
        for name, obj in _checked(extra):
            names[name] = obj
    return [(n, "") for n in names], names
