"""One contract every Format passes, shipped so outside formats can run it too.

A format's test is a small subclass: the format's registry name, a few array metadata documents
(bytes, with small grids), and :class:`RuleCase` pairs that show each metadata rule at its
boundary. The contract then checks what every caller of a format relies on:

1. a chunk encoded at any in-grid position (edge chunks included) validates and decodes to the
   values written;
2. ``chunk_key`` and ``classify`` agree on every position, a key just outside the grid is a
   CHUNK with ``in_grid`` False, and a chunk-like key that breaks the grammar (sign, leading
   zero, wrong separator, ``c`` missing or extra, wrong number of indices) is INVALID;
3. metadata parsing of fuzzed bytes, JSON and mutated documents raises Rejected and nothing
   else (never KeyError, TypeError, RecursionError...);
4. every RuleCase's accepted document parses and its refused one is Rejected with its rule, and
   the cases cover the rules the subclass lists as ``required_rules``;
5. garbage and truncated chunks are Rejected, and a decompression bomb is refused uninflated
   (rule ``decoded-size``).

Lists are plain class attributes so whoever adds a rule to a format adds a RuleCase beside it.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from n5fs.errors import Rejected
from n5fs.formats.base import CHUNK_KEY_RULE, ArrayNode, KeyKind, chunk_like
from n5fs.formats.registry import get_format

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from n5fs.formats.base import Format


@dataclass(frozen=True)
class RuleCase:
    """A metadata rule at its boundary: ``accepted`` parses; ``refused``, a small change of
    it, is Rejected with ``rule``. Both are the metadata file ``file`` (default: the
    contract's ``array_file``)."""

    rule: str
    accepted: bytes
    refused: bytes
    name: str
    file: str = ""


def doc(value: Any) -> bytes:
    """A JSON document as the bytes of a metadata file."""
    return json.dumps(value).encode()


#: names a writer leaves beside chunks (temp files, notes): never chunk-like, always OTHER
PLAIN_NAMES = ("README.md", "0.0.partial", ".0.0.XyZ123", "0__lock", "c.tmp")
#: Hypothesis budget per fuzz test (three fuzz tests per format stay within 200 examples)
FUZZ_EXAMPLES = 60
#: largest decoded chunk the fuzz test validates (mutations may promise gigabytes)
FUZZ_MAX_CHUNK_BYTES = 1 << 22
#: most chunks an array of the contract may have (every position is encoded and decoded)
MAX_GRID = 64

_FUZZ = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    # the contract's tests run once per subclass: that is the design, not a mistake
    suppress_health_check=[HealthCheck.differing_executors, HealthCheck.too_slow],
)
JSON_VALUES: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text(max_size=8)
    | st.sampled_from(["", "c", "/", ".", "NaN", "0x7fc00000", "gzip", "<i4", "uint8"]),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_SEPARATOR = re.compile(r"([./])")


# --------------------------------------------------------------------------- helpers


def positions(grid: Sequence[int]) -> list[tuple[int, ...]]:
    """Every in-grid position, in C order (``[()]`` for a 0-d array)."""
    return list(itertools.product(*(range(g) for g in grid)))


def extent(node: ArrayNode, position: tuple[int, ...]) -> tuple[int, ...]:
    """The part of the chunk at ``position`` inside the array (edge chunks are clipped)."""
    return tuple(
        min(c, s - p * c) for p, c, s in zip(position, node.chunks, node.shape, strict=True)
    )


def sample_values(dtype: np.dtype[Any], shape: tuple[int, ...], seed: int) -> np.ndarray[Any, Any]:
    """Deterministic values of ``dtype`` that use the type's whole range where it has one."""
    rng = np.random.default_rng(seed)
    count = math.prod(shape)
    kind, native = dtype.kind, dtype.newbyteorder("=")
    flat: np.ndarray[Any, Any]
    if kind == "b":
        flat = rng.integers(0, 2, count).astype(bool)
    elif kind in "iu":
        info = np.iinfo(native)
        flat = rng.integers(info.min, info.max, count, endpoint=True, dtype=native)
    elif kind == "f":
        flat = (rng.standard_normal(count) * 1000).astype(native)
    elif kind == "c":
        flat = (rng.standard_normal(count) + 1j * rng.standard_normal(count)).astype(native)
    elif kind in "mM":
        flat = rng.integers(-(10**6), 10**6, count).astype(np.int64).view(native)
    elif kind in "OSU":
        words = [("xy" * int(n))[: max(1, dtype.itemsize // 4)] for n in rng.integers(0, 4, count)]
        flat = np.array(words, dtype=object if kind == "O" else dtype)
    else:  # V and structured: any bytes are values
        flat = np.frombuffer(rng.bytes(count * dtype.itemsize), dtype=dtype).copy()
    return flat.reshape(shape)


def same_values(got: np.ndarray[Any, Any], expected: np.ndarray[Any, Any]) -> bool:
    """Equal element for element: objects by value, everything else bit for bit (NaN too)."""
    if got.shape != expected.shape:
        return False
    if got.dtype.hasobject or expected.dtype.hasobject:
        return bool(got.tolist() == expected.tolist())
    return (
        np.ascontiguousarray(got).tobytes()
        == np.ascontiguousarray(expected.astype(got.dtype)).tobytes()
    )


def broken_keys(key: str) -> set[str]:
    """Chunk-like keys near ``key`` that no array's grammar can share with it: a signed or
    zero-padded index, one index more or fewer, the other separator, ``c`` added or dropped.
    (A key of the array's own grammar may still appear: callers drop the valid ones.)"""
    tokens = _SEPARATOR.split(key)
    separators = tokens[1::2]
    sep = separators[0] if separators else "/"
    headed = tokens[0] == "c"
    indices = [i for i in range(0, len(tokens), 2) if i or not headed]
    out = {key + s + "0" for s in ({sep} if separators else {"/", "."})}
    if indices:
        last = indices[-1]
        out |= {
            "".join([*tokens[:last], bad, *tokens[last + 1 :]])
            for bad in ("0" + tokens[last], "+" + tokens[last], "-" + tokens[last])
        }
        out.add("".join(tokens[: max(0, last - 1)]))
    if separators:
        out.add(key.replace(sep, "." if sep == "/" else "/"))
    out.add("".join(tokens[2:]) if headed else "c" + sep + key)
    return {k for k in out if chunk_like(k)}


def json_paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every member and item of a JSON value, as a path of keys and indices."""
    if isinstance(value, dict):
        items: list[tuple[Any, Any]] = list(value.items())
    elif isinstance(value, list):
        items = list(enumerate(value))
    else:
        return []
    found: list[tuple[Any, ...]] = []
    for key, child in items:
        found.append((*prefix, key))
        found.extend(json_paths(child, (*prefix, key)))
    return found


def mutated(document: Any, path: tuple[Any, ...], replacement: Any, drop: bool) -> Any:
    """A deep copy of ``document`` with ``path`` removed (``drop``) or set to ``replacement``."""
    copy = json.loads(json.dumps(document))
    *parents, last = path
    target = copy
    for step in parents:
        target = target[step]
    if drop:
        del target[last]
    else:
        target[last] = replacement
    return copy


# --------------------------------------------------------------------------- the contract


class FormatContract:
    """Subclasses set ``format_name``, ``array_file``, ``arrays``, ``rule_cases`` and
    ``required_rules``; formats with a compressor also override :meth:`bomb`::

        class TestMine(FormatContract):
            format_name = "zarr3"
            array_file = "zarr.json"
            arrays = {"int16-gzip": doc(ARRAY)}
            rule_cases = [RuleCase("shape", doc(ARRAY), doc({**ARRAY, "shape": [-1]}), "neg")]
            required_rules = frozenset({"shape"})
    """

    #: the format's name in :mod:`n5fs.formats.registry`
    format_name: ClassVar[str]
    #: the metadata file an array's document is (``zarr.json``, ``.zarray``...)
    array_file: ClassVar[str]
    #: array documents by a short id: several dtypes, codecs, 1-D..3-D, edge chunks
    arrays: ClassVar[Mapping[str, bytes]]
    #: each metadata rule at its boundary
    rule_cases: ClassVar[Sequence[RuleCase]]
    #: rules the format raises most; the RuleCases must show each of them
    required_rules: ClassVar[frozenset[str]]
    #: how many of ``arrays`` must yield a :meth:`bomb` (0: the format cannot compress)
    min_bombs: ClassVar[int] = 1

    def bomb(self, name: str, node: ArrayNode) -> bytes | None:
        """Chunk bytes for the first position of array ``name`` that decode to far more than a
        chunk (a few KiB inflating to megabytes), or None when its codecs do not compress."""
        return None

    @property
    def fmt(self) -> Format:
        return get_format(self.format_name)

    def node(self, name: str) -> ArrayNode:
        found = self.fmt.parse_metadata(self.array_file, self.arrays[name], path=self.array_file)
        assert isinstance(found, ArrayNode), f"{name}: {self.array_file} is not an array"
        return found

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """One test per array document and per rule case, with readable ids."""
        if "array" in metafunc.fixturenames:
            metafunc.parametrize("array", sorted(self.arrays))
        if "case" in metafunc.fixturenames:
            cases = list(self.rule_cases)
            metafunc.parametrize("case", cases, ids=[c.name for c in cases])

    def refused(self, call: Callable[[], object], path: str) -> Rejected:
        """The Rejected ``call`` raises, checked to name ``path`` and this format."""
        with pytest.raises(Rejected) as info:
            call()
        assert (info.value.path, info.value.fmt) == (path, self.format_name), info.value
        assert info.value.rule, info.value
        return info.value

    def chunk_refused(self, node: ArrayNode, position: tuple[int, ...], data: bytes) -> Rejected:
        """The Rejected validating ``data`` at ``position`` raises (as key ``k``)."""
        return self.refused(lambda: node.validate_chunk(position, data, path="k"), "k")

    # -- 1. chunks round-trip ----------------------------------------------------------------

    def test_arrays_are_small(self, array: str) -> None:
        grid = self.node(array).grid
        assert 0 < math.prod(grid) <= MAX_GRID, f"{array}: grid {grid} (keep 1..{MAX_GRID})"

    def test_every_chunk_round_trips(self, array: str) -> None:
        node = self.node(array)
        for seed, position in enumerate(positions(node.grid)):
            inside = extent(node, position)
            values = sample_values(node.dtype, inside, seed)
            data = node.encode_chunk(position, values)
            key = f"{array}/{node.chunk_key(position)}"
            node.validate_chunk(position, data, path=key)
            decoded = node.decode_chunk(position, data)
            assert decoded.shape in (inside, node.chunks), (key, decoded.shape)
            region = decoded[tuple(slice(0, n) for n in inside)]
            assert same_values(region, values), key

    # -- 2. chunk keys -----------------------------------------------------------------------

    def test_chunk_keys_classify_back(self, array: str) -> None:
        node = self.node(array)
        assert node.classify(self.array_file).kind is KeyKind.METADATA
        for position in positions(node.grid):
            found = node.classify(node.chunk_key(position))
            assert (found.kind, found.position, found.in_grid) == (KeyKind.CHUNK, position, True)

    def test_keys_just_outside_the_grid(self, array: str) -> None:
        node = self.node(array)
        for axis, size in enumerate(node.grid):
            position = tuple(size if a == axis else 0 for a in range(len(node.grid)))
            key = node.chunk_key(position)
            found = node.classify(key)
            assert (found.kind, found.position, found.in_grid) == (KeyKind.CHUNK, position, False)
            assert self.chunk_refused(node, position, bytes(8)).rule == "out-of-grid"

    def test_keys_breaking_the_grammar_are_invalid(self, array: str) -> None:
        node = self.node(array)
        grid = positions(node.grid)
        valid = {node.chunk_key(p) for p in grid}
        for position in {grid[0], grid[-1]}:
            for key in sorted(broken_keys(node.chunk_key(position)) - valid):
                found = node.classify(key)
                assert (found.kind, found.rule) == (KeyKind.INVALID, CHUNK_KEY_RULE), (key, found)
                assert found.message, key

    def test_plain_names_are_other(self, array: str) -> None:
        node = self.node(array)
        for name in PLAIN_NAMES:
            assert node.classify(name).kind is KeyKind.OTHER, name

    # -- 3. fuzzed metadata ------------------------------------------------------------------

    def parses_or_rejects(self, name: str, data: bytes) -> None:
        """Parse; a parsed array must also answer key and chunk questions without crashing."""
        try:
            node = self.fmt.parse_metadata(name, data, path=name)
        except Rejected:
            return
        if not isinstance(node, ArrayNode):
            return
        position = (0,) * len(node.shape)
        assert node.classify(node.chunk_key(position)).kind is KeyKind.CHUNK
        node.classify("c/0.0")
        if math.prod(node.chunks) * node.dtype.itemsize <= FUZZ_MAX_CHUNK_BYTES:
            try:
                node.validate_chunk(position, bytes(range(40)), path="x")
            except Rejected:
                return

    @_FUZZ
    @given(data=st.data())
    def test_fuzzed_bytes_only_raise_rejected(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.fmt.metadata_names)))
        self.parses_or_rejects(name, data.draw(st.binary(max_size=300)))

    @_FUZZ
    @given(data=st.data())
    def test_fuzzed_json_only_raises_rejected(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.fmt.metadata_names)))
        self.parses_or_rejects(name, doc(data.draw(JSON_VALUES)))

    @_FUZZ
    @given(data=st.data())
    def test_mutated_documents_only_raise_rejected(self, data: st.DataObject) -> None:
        seeds = [(self.array_file, raw) for raw in self.arrays.values()]
        seeds += [(c.file or self.array_file, c.accepted) for c in self.rule_cases]
        name, raw = data.draw(st.sampled_from(seeds))
        document = json.loads(raw)
        paths = json_paths(document)
        if not paths:
            return
        path = data.draw(st.sampled_from(paths))
        drop = data.draw(st.booleans())
        changed = mutated(document, path, None if drop else data.draw(JSON_VALUES), drop)
        self.parses_or_rejects(name, doc(changed))

    # -- 4. rule cases -----------------------------------------------------------------------

    def test_rule_case(self, case: RuleCase) -> None:
        file = case.file or self.array_file
        self.fmt.parse_metadata(file, case.accepted, path=f"a/{file}")
        error = self.refused(
            lambda: self.fmt.parse_metadata(file, case.refused, path=f"a/{file}"), f"a/{file}"
        )
        assert error.rule == case.rule, (case.name, error)

    def test_rule_cases_cover_the_required_rules(self) -> None:
        names = [c.name for c in self.rule_cases]
        assert len(set(names)) == len(names), "RuleCase names must be unique"
        missing = sorted(self.required_rules - {c.rule for c in self.rule_cases})
        assert not missing, f"{self.format_name}: no RuleCase shows rule(s) {missing}"

    def test_ordinary_node_names_are_allowed(self) -> None:
        for name in ("a", "raw_1", "Image-2.v1", "0", "c"):
            assert self.fmt.node_name_problem(name) is None, name

    # -- 5. bad chunks -----------------------------------------------------------------------

    @_FUZZ
    @given(data=st.data())
    def test_garbage_chunks_only_raise_rejected(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.arrays)))
        node = self.node(name)
        position = data.draw(st.sampled_from(positions(node.grid)))
        chunk = data.draw(st.binary(max_size=400))
        error: Rejected | None = None
        try:
            node.validate_chunk(position, chunk, path="k")
        except Rejected as exc:
            error = exc
        if error is None:  # random bytes that happen to be a chunk: it must decode
            assert node.decode_chunk(position, chunk).shape in (extent(node, position), node.chunks)
        else:
            assert (error.path, error.fmt) == ("k", self.format_name), error

    def test_truncated_chunks_are_rejected(self, array: str) -> None:
        node = self.node(array)
        position = positions(node.grid)[-1]
        data = node.encode_chunk(position, sample_values(node.dtype, extent(node, position), 7))
        for size in sorted({0, len(data) // 2, len(data) - 1}):
            self.chunk_refused(node, position, data[:size])

    def test_decompression_bombs_are_refused(self) -> None:
        bombs = 0
        for name in sorted(self.arrays):
            node = self.node(name)
            bomb = self.bomb(name, node)
            if bomb is None:
                continue
            bombs += 1
            error = self.chunk_refused(node, positions(node.grid)[0], bomb)
            assert error.rule == "decoded-size", (name, error)
        assert bombs >= self.min_bombs, f"only {bombs} of the arrays gave a bomb"
