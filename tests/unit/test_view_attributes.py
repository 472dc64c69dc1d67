"""Zarr attributes as N5 attributes and back (:mod:`n5fs.views.attributes`).

What "fits" an N5 key is what TensorStore's n5 driver (and n5-viewer) accept: every N5
document :func:`to_n5` makes, whatever the Zarr attributes, is opened by TensorStore here,
and :func:`from_n5` gives the Zarr attributes and dimension names back unchanged.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
import tensorstore as ts
from hypothesis import given, settings
from hypothesis import strategies as st

from n5fs.views.attributes import CONVENTIONS, NAMESPACE, RESERVED, fits, from_n5, to_n5

RANK = 3


@pytest.mark.parametrize(
    ("key", "value", "rank", "want"),
    [
        ("units", "counts", 3, False),
        ("units", ["nm", "nm", "s"], 3, True),
        ("units", ["nm", "nm"], 3, False),
        ("units", ["nm", 1, "s"], 3, False),
        ("units", ["nm"], None, True),  # a group: no length to check
        ("resolution", [1, 2.5, 4], 3, True),
        ("resolution", [1, True, 4], 3, False),  # TensorStore refuses a boolean
        ("resolution", [1, 2], 3, False),
        ("resolution", "4nm", 3, False),
        ("resolution", [1, float("inf"), 2], 3, False),
        ("axes", ["x", "y", "z"], 3, True),
        ("axes", ["x", "", ""], 3, True),  # TensorStore's unlabeled axes
        ("axes", ["x", "x", "z"], 3, False),  # TensorStore refuses repeated labels
        ("axes", ["x", None, "z"], 3, False),
        ("axes", "zyx", 3, False),
        ("downsamplingFactors", [2, 2, 1], 3, True),
        ("downsamplingFactors", [[1, 1, 1], [2, 2, 1]], 3, False),
        ("downsamplingFactors", [[1, 1, 1], [2, 2, 1]], None, True),  # a multiscale group
        ("downsamplingFactors", 2, 3, False),
        ("pixelResolution", {"dimensions": [1, 1, 4], "unit": "um"}, 3, True),
        ("pixelResolution", {"dimensions": [1, 1, 4]}, 3, False),
        ("pixelResolution", {"dimensions": [1, 1], "unit": "um"}, 3, False),
        ("pixelResolution", [1, 1, 4], 3, True),  # n5-viewer's older form
        ("pixelResolution", "1um", 3, False),
        ("dimensions", [1, 2, 3], 3, False),  # N5's own keys never fit
        ("n5", "4.0.0", None, False),
        ("compressionType", "gzip", 3, False),
        (NAMESPACE, {}, 3, False),
        ("anything", "else", 3, True),
    ],
)
def test_what_fits_an_n5_key(key: str, value: Any, rank: int | None, want: bool) -> None:
    assert fits(key, value, rank) is want


def test_units_counts_is_kept_aside_and_fitting_conventions_are_reversed() -> None:
    zarr = {
        "units": "counts",
        "resolution": [4, 2, 1],
        "dimensions": "mine",
        "pixelResolution": {"dimensions": [4, 2, 1], "unit": "um", "note": 1},
        "other": [1, 2, 3],
    }
    n5 = to_n5(zarr, 3, ("z", None, "x"), named=True)
    assert n5 == {
        "resolution": [1, 2, 4],
        "pixelResolution": {"dimensions": [1, 2, 4], "unit": "um", "note": 1},
        "other": [1, 2, 3],
        "axes": ["x", "", "z"],
        NAMESPACE: {"units": "counts", "dimensions": "mine"},
    }
    assert from_n5(n5, 3, named=True) == (zarr, ("z", None, "x"))


def test_axis_names_of_v3_arrays_v2_arrays_and_groups() -> None:
    # v3: names are dimension_names; an `axes` attribute stays an attribute
    n5 = to_n5({"axes": ["a", "b"]}, 2, ("y", "x"), named=True)
    assert n5 == {"axes": ["x", "y"], NAMESPACE: {"axes": ["a", "b"]}}
    assert from_n5(n5, 2, named=True) == ({"axes": ["a", "b"]}, ("y", "x"))
    # repeated names have no N5 form; all-null names come back null
    assert to_n5({}, 2, ("x", "x"), named=True) == {}
    assert to_n5({}, 2, (None, None), named=True) == {"axes": ["", ""]}
    assert from_n5({"axes": ["", ""]}, 2, named=True) == ({}, (None, None))
    # v2 and groups: a fitting `axes` attribute is N5's axes, reversed
    assert to_n5({"axes": ["y", "x"]}, 2) == {"axes": ["x", "y"]}
    assert from_n5({"axes": ["x", "y"]}, 2) == ({"axes": ["y", "x"]}, None)
    groups = {"downsamplingFactors": [[1, 1, 1], [2, 2, 1]], "axes": ["c", "y", "x"]}
    assert to_n5(groups) == {"downsamplingFactors": [[1, 1, 1], [1, 2, 2]], "axes": ["x", "y", "c"]}


def test_n5_documents_of_other_writers() -> None:
    # N5's own keys are no attributes; a namespace that is no object is an ordinary attribute
    native = {"dimensions": [4, 3], "n5": "4.0.0", "compressionType": "raw", "units": ["nm", "s"]}
    assert from_n5(native, 2) == ({"units": ["s", "nm"]}, None)
    assert from_n5({NAMESPACE: "x"}, 2) == ({NAMESPACE: "x"}, None)
    assert to_n5({NAMESPACE: "x"}, 2) == {NAMESPACE: {NAMESPACE: "x"}}
    # a non-fitting convention shows as it is (a writer writing it back moves it aside)
    assert from_n5({"units": "counts"}, 2) == ({"units": "counts"}, None)
    # the namespace wins over a key of the same name beside it
    assert from_n5({"units": ["a", "b"], NAMESPACE: {"units": 1}}, 2) == ({"units": 1}, None)


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=8,
)
NAME = st.sampled_from(["x", "y", "z", "t", ""])
PER_AXIS = st.one_of(
    st.lists(NAME, min_size=RANK, max_size=RANK),
    st.lists(st.integers(0, 9) | st.floats(0, 9) | st.booleans(), min_size=RANK, max_size=RANK),
    st.fixed_dictionaries(
        {"dimensions": st.lists(st.integers(1, 4), min_size=RANK - 1, max_size=RANK)},
        optional={"unit": st.sampled_from(["um", 1])},
    ),
)
KEYS = st.sampled_from([*CONVENTIONS, *sorted(RESERVED), "title", "scales"])
ATTRS = st.dictionaries(KEYS, PER_AXIS | JSON, max_size=6)
NAMES = st.none() | st.lists(NAME | st.none(), min_size=RANK, max_size=RANK).map(tuple)


def _tensorstore_opens(attrs: dict[str, Any]) -> tuple[str, ...]:
    doc = {"dimensions": [4, 3, 2], "blockSize": [2, 2, 2], "dataType": "uint8"}
    doc |= {"compression": {"type": "raw"}, **attrs}
    with tempfile.TemporaryDirectory() as where:
        (Path(where) / "attributes.json").write_text(json.dumps(doc))
        spec = {"driver": "n5", "kvstore": {"driver": "file", "path": where}}
        store = ts.open(spec).result()
        assert store.read().result().shape == (4, 3, 2)
        return tuple(store.domain.labels)


@settings(max_examples=150, deadline=None)
@given(attrs=ATTRS, names=NAMES, named=st.booleans())
def test_any_zarr_attributes_open_in_tensorstore_and_come_back(
    attrs: dict[str, Any], names: tuple[str | None, ...] | None, named: bool
) -> None:
    n5 = to_n5(attrs, RANK, names, named=named)
    assert not RESERVED & (n5.keys() - {NAMESPACE})
    labels = _tensorstore_opens(n5)
    back_attrs, back_names = from_n5(n5, RANK, named=named)
    assert back_attrs == attrs
    named_axes = [n for n in names or () if n]
    if named and names is not None and len(set(named_axes)) == len(named_axes):
        assert back_names == tuple(n or None for n in names)  # "" and null: one unlabeled axis
        assert labels == tuple(n or "" for n in names[::-1])
    else:
        assert back_names is None
    assert to_n5(back_attrs, RANK, back_names, named=named) == n5
