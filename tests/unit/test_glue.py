"""The private mfusepy glue n5fs overrides is checked at import: a release that
renamed ``readdir_fuse_3`` would otherwise leave our override unused and mounts quietly
worse (``mv -n`` clobbering, one getattr per listed file), not broken."""

from __future__ import annotations

import ctypes
import sys
import types
from typing import Any

import pytest

from n5fs.fuse_front import _lib
from tests import REPO_ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

mfusepy = pytest.importorskip("mfusepy")


def stand_in(**changes: Any) -> types.ModuleType:
    """A copy of the installed mfusepy with some attributes replaced (None: removed)."""
    module = types.ModuleType("stand_in_mfusepy")
    module.__dict__.update({k: v for k, v in vars(mfusepy).items() if not k.startswith("__")})
    for name, value in changes.items():
        if value is None:
            delattr(module, name)
        else:
            setattr(module, name, value)
    return module


def fuse_class_without(method: str) -> type:
    """mfusepy's FUSE as a subclass would see it, one glue method fewer."""
    names = [n for n in dir(mfusepy.FUSE) if not n.startswith("__") and n != method]
    return type("FUSE", (), {n: getattr(mfusepy.FUSE, n) for n in names})


class FileInfoWithoutDirectIO(ctypes.Structure):
    _fields_ = [
        (name, *rest) for name, *rest in mfusepy.fuse_file_info._fields_ if name != "direct_io"
    ]


def test_the_installed_mfusepy_has_the_glue() -> None:
    _lib.check_glue(mfusepy)  # what the import itself did
    _lib.check_glue(stand_in())  # and the stand-in is a faithful copy


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"_libfuse": None}, "stand_in_mfusepy._libfuse"),
        ({"set_st_attrs": None}, "stand_in_mfusepy.set_st_attrs"),
        ({"FUSE": fuse_class_without("readdir_fuse_3")}, "stand_in_mfusepy.FUSE.readdir_fuse_3"),
        ({"FUSE": fuse_class_without("rename_fuse_3")}, "stand_in_mfusepy.FUSE.rename_fuse_3"),
        ({"FUSE": None}, "stand_in_mfusepy.FUSE.open"),
        ({"fuse_file_info": FileInfoWithoutDirectIO}, "stand_in_mfusepy.fuse_file_info.direct_io"),
    ],
)
def test_a_missing_glue_attribute_is_named_with_the_supported_range(
    changes: dict[str, Any], named: str
) -> None:
    with pytest.raises(ImportError) as caught:
        _lib.check_glue(stand_in(**changes))
    message = str(caught.value)
    assert named in message
    assert "mfusepy >=3.0,<4" in message


def test_every_missing_attribute_is_named_at_once() -> None:
    with pytest.raises(ImportError) as caught:
        _lib.check_glue(types.ModuleType("empty"))
    message = str(caught.value)
    for name in ("empty._libfuse", "empty.c_stat", "empty.FUSE.truncate_fuse_3"):
        assert name in message
    assert "empty.fuse_context.fuse" in message


def test_pyproject_pins_the_same_range() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    assert f"mfusepy{_lib.SUPPORTED_MFUSEPY}" in project["project"]["dependencies"]
