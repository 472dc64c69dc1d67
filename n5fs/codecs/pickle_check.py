"""Pickle chunks checked without unpickling: the opcode stream is walked statically
(:func:`pickletools.genops`) for its framing and the globals it names.

Loading a pickle runs whatever callables it names, so n5fs never loads one; it only checks that
each global a chunk would load is a plain value type (:data:`SAFE_PICKLE_GLOBALS`) or one the
array's format allows for its writer's own value classes (hdmf-zarr's ``ZarrReference``).
"""

from __future__ import annotations

import pickletools
from typing import Any

from n5fs.codecs.limits import CodecError

#: the only globals a stored pickle may name: what numpy object arrays of plain values need
# fmt: off
SAFE_PICKLE_GLOBALS = frozenset((
    "numpy.ndarray", "numpy.dtype", "_codecs.encode", "copyreg._reconstructor",
    "copy_reg._reconstructor", "numpy.core.multiarray._reconstruct",
    "numpy._core.multiarray._reconstruct", "numpy.core.multiarray.scalar",
    "numpy._core.multiarray.scalar", "numpy.core.numeric._frombuffer",
    "numpy._core.numeric._frombuffer", "collections.OrderedDict", "decimal.Decimal",
    "uuid.UUID", "fractions.Fraction", "datetime.date", "datetime.datetime", "datetime.time",
    "datetime.timedelta", "datetime.timezone",
    *(f"{module}.{name}" for module in ("builtins", "__builtin__") for name in (
        "object", "set", "frozenset", "complex", "bytearray", "slice", "range", "list", "dict",
        "tuple", "int", "float", "str", "bytes", "bool")),
))
# fmt: on


_STRING_OPS = frozenset(
    {
        "STRING",
        "BINSTRING",
        "SHORT_BINSTRING",
        "UNICODE",
        "BINUNICODE",
        "SHORT_BINUNICODE",
        "BINUNICODE8",
    }
)
_NO_STACK_OPS = frozenset({"PROTO", "FRAME", "MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"})


def check_pickle(
    data: bytes, *, protocol: int, allowed: frozenset[str] = SAFE_PICKLE_GLOBALS
) -> None:
    """Check a pickle's framing and the globals it names, without unpickling it.

    :func:`pickletools.genops` only parses opcodes. The walk tracks which strings sit on top
    of the stack (and in the memo) so ``STACK_GLOBAL`` can be named; a global that cannot be
    named, or is not in ``allowed``, is refused: loading it would run arbitrary code.
    """
    if protocol >= 2 and (len(data) < 2 or data[0] != 0x80 or not 2 <= data[1] <= 5):
        raise CodecError("pickle chunk lacks the protocol header (0x80, 2..5)", rule="pickle")
    walk = _PickleWalk(allowed)
    try:
        for op, arg, pos in pickletools.genops(data):
            walk.step(op.name, arg, pos)
    except CodecError:
        raise
    except ValueError as exc:
        raise CodecError(f"pickle chunk is malformed: {exc}", rule="pickle") from exc
    if walk.end != len(data):
        raise CodecError("pickle chunk does not end with its STOP opcode", rule="pickle")


class _PickleWalk:
    """Which strings are on top of the pickle stack and in its memo: just enough to name globals.

    Every opcode that touches the stack is recorded, so the last two records are strings only
    when the last two pushes were strings: a crafted stream cannot make a global look safe.
    """

    def __init__(self, allowed: frozenset[str]) -> None:
        self.allowed = allowed
        self.recent: list[str | None] = []
        self.memo: dict[int, str | None] = {}
        self.end = -1

    def step(self, name: str, arg: Any, pos: int | None) -> None:
        top = self.recent[-1] if self.recent else None
        if name == "STOP":
            self.end = -1 if pos is None else pos + 1
        elif name in ("GLOBAL", "INST"):
            self.check_global(str(arg).replace(" ", "."))
        elif name == "STACK_GLOBAL":
            pair = self.recent[-2:]
            module, qualname = pair if len(pair) == 2 else [None, None]
            self.check_global(
                None if module is None or qualname is None else f"{module}.{qualname}"
            )
        elif name.startswith("EXT"):
            self.check_global(None)  # the extension registry can name any global
        elif name == "MEMOIZE":
            self.memo[len(self.memo)] = top
        elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
            self.memo[int(arg)] = top
        if name in _NO_STACK_OPS:
            return
        if name in _STRING_OPS:
            self.recent.append(str(arg))
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            self.recent.append(self.memo.get(int(arg)))
        else:
            self.recent.append(None)
        del self.recent[:-2]

    def check_global(self, name: str | None) -> None:
        if name is None:
            raise CodecError(
                "pickle chunk loads a global it does not name plainly; refused "
                "(loading it could run arbitrary code)",
                rule="pickle-global",
            )
        if name not in self.allowed:
            raise CodecError(
                f"pickle chunk loads {name!r}, which is not a plain value type "
                "(nor one this array's format allows); refused (unpickling it could run "
                "arbitrary code)",
                rule="pickle-global",
            )
