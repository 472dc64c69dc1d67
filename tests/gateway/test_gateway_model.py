"""The gateway against a dict model: any sequence of POSIX-shaped calls on plain files leaves
the same tree, and the same bytes, as the model says. The rules are docs/semantics.md's; a
Hypothesis state machine drives the gateway and the model side by side, so the sequences
tried are ones nobody thought to write down."""

from __future__ import annotations

import os
import tempfile

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from n5fs.errors import IsAPrefix, NotAPrefix, PrefixNotEmpty
from n5fs.gateway import Gateway
from n5fs.kvstore.file import FileStore
from n5fs.kvstore.memory import MemoryStore

names = st.sampled_from(["a", "b", "c.txt", "0.0"])
paths = st.lists(names, min_size=1, max_size=3).map(lambda parts: "/" + "/".join(parts))


class GatewayVsModel(RuleBasedStateMachine):
    use_file_store = False

    def __init__(self) -> None:
        super().__init__()
        self._tmp = tempfile.TemporaryDirectory()
        store = FileStore(self._tmp.name) if self.use_file_store else MemoryStore()
        self.gw = Gateway(store)
        self.model: dict[str, bytes] = {}
        self.dirs: set[str] = set()  # directories stay when their last file goes, as on disk

    @staticmethod
    def _ancestors(key: str) -> set[str]:
        parts = key.split("/")
        return {"/".join(parts[:i]) for i in range(1, len(parts))}

    def _conflicts(self, path: str) -> bool:
        """A file cannot sit where a directory is, or under a file (POSIX)."""
        key = path.strip("/")
        return key in self.dirs or any(a in self.model for a in self._ancestors(key))

    def _put(self, key: str, value: bytes) -> None:
        self.model[key] = value
        self.dirs |= self._ancestors(key)

    @rule(path=paths, data=st.binary(max_size=40))
    def write(self, path: str, data: bytes) -> None:
        if self._conflicts(path):
            with pytest.raises((IsAPrefix, NotAPrefix)):
                self.gw.write_file(path, data)
            return
        self.gw.write_file(path, data)
        self._put(path.strip("/"), data)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def overwrite_middle(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.model)))
        offset = data.draw(st.integers(0, 50))
        patch = data.draw(st.binary(min_size=1, max_size=8))
        fh = self.gw.open("/" + key, os.O_RDWR)
        self.gw.write(fh, patch, offset)
        self.gw.flush(fh)
        self.gw.release(fh)
        old = self.model[key]
        grown = old + bytes(max(0, offset - len(old)))
        self.model[key] = grown[:offset] + patch + grown[offset + len(patch) :]

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def unlink(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.model)))
        self.gw.unlink("/" + key)
        del self.model[key]

    @precondition(lambda self: self.model)
    @rule(data=st.data(), dest=paths)
    def rename(self, data: st.DataObject, dest: str) -> None:
        key = data.draw(st.sampled_from(sorted(self.model)))
        new = dest.strip("/")
        if new == key:
            return
        if self._conflicts(dest):  # onto a directory, or under a file (maybe the source)
            with pytest.raises((IsAPrefix, NotAPrefix)):
                self.gw.rename("/" + key, dest)
            return
        self.gw.rename("/" + key, dest)
        self._put(new, self.model.pop(key))

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.model)))
        length = data.draw(st.integers(0, 60))
        self.gw.truncate("/" + key, length)
        old = self.model[key]
        self.model[key] = old[:length] + bytes(max(0, length - len(old)))

    @rule(path=paths)
    def rmdir(self, path: str) -> None:
        key = path.strip("/")
        if key not in self.dirs:
            return
        if any(k.startswith(key + "/") for k in [*self.model, *self.dirs]):
            with pytest.raises(PrefixNotEmpty):
                self.gw.rmdir(path)
            return
        self.gw.rmdir(path)
        self.dirs.discard(key)

    @invariant()
    def same_tree(self) -> None:
        assert self.gw.walk_keys() == sorted(self.model)
        for folder in self.dirs:
            assert self.gw.stat("/" + folder).kind.value == "dir"
        for key, value in self.model.items():
            assert self.gw.read_file("/" + key) == value
            assert self.gw.stat("/" + key).size == len(value)

    def teardown(self) -> None:
        self._tmp.cleanup()


class FileGatewayVsModel(GatewayVsModel):
    use_file_store = True


_settings = settings(max_examples=30, stateful_step_count=25, deadline=None)
TestMemoryGatewayVsModel = GatewayVsModel.TestCase
TestMemoryGatewayVsModel.settings = _settings
TestFileGatewayVsModel = FileGatewayVsModel.TestCase
TestFileGatewayVsModel.settings = _settings
