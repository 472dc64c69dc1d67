"""The staging buffer behaves like a file: holes read as zeros, truncate both ways, spill."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from n5fs.gateway.staging import StagedFile

ops = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(0, 300), st.binary(min_size=1, max_size=90)),
        st.tuples(st.just("truncate"), st.integers(0, 400), st.just(b"")),
    ),
    max_size=25,
)


@settings(max_examples=200, deadline=None)
@given(initial=st.binary(max_size=50), steps=ops, spill=st.sampled_from([64, 1 << 20]))
def test_staged_file_matches_a_bytearray(initial: bytes, steps: list, spill: int) -> None:
    staged = StagedFile(initial, spill_bytes=spill)
    model = bytearray(initial)
    for op, n, data in steps:
        if op == "write":
            if n > len(model):
                model.extend(bytes(n - len(model)))
            model[n : n + len(data)] = data
            staged.write(data, n)
        else:
            del model[n:]
            model.extend(bytes(n - len(model)))
            staged.truncate(n)
        assert staged.size == len(model)
    assert staged.getvalue() == bytes(model)
    assert staged.read(7, 3) == bytes(model[3:10])
    staged.close()


def test_spill_moves_to_a_temp_file() -> None:
    staged = StagedFile(spill_bytes=1000)
    staged.write(b"a" * 600, 0)
    assert not staged.spilled
    staged.write(b"b" * 600, 600)
    assert staged.spilled
    assert staged.spill_path() is not None
    assert staged.getvalue() == b"a" * 600 + b"b" * 600
    staged.close()
