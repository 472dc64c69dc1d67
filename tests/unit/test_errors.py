from __future__ import annotations

import errno

import pytest

from n5fs import errors
from n5fs.errors import N5fsError, errno_of


def _all_subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


def test_every_error_class_declares_its_errno() -> None:
    classes = _all_subclasses(N5fsError)
    assert len(classes) >= 12
    for cls in classes:
        # declared on the class itself, or inherited from an n5fs class that declares it
        owner = next(c for c in cls.__mro__ if "errno_code" in vars(c))
        assert issubclass(owner, N5fsError), cls
        assert owner.errno_code in errno.errorcode, cls


def test_errors_are_also_the_builtins_callers_catch() -> None:
    assert issubclass(errors.KeyNotFound, FileNotFoundError)
    assert issubclass(errors.ReadOnly, PermissionError)
    assert issubclass(errors.Rejected, ValueError)
    assert issubclass(errors.InvalidKey, ValueError)


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (errors.KeyNotFound("k"), errno.ENOENT),
        (errors.ReadOnly("k"), errno.EROFS),
        (errors.Rejected("bad", path="a/0.0", fmt="zarr2", rule="decoded-size"), errno.EINVAL),
        (errors.StoreUnavailable("down"), errno.EIO),
        (errors.FileTooLarge("x"), errno.EFBIG),
        (errors.PrefixNotEmpty("x"), errno.ENOTEMPTY),
        (OSError(errno.ENOSPC, "full"), errno.ENOSPC),
        (RuntimeError("bug"), errno.EIO),  # never EINVAL: that means "rejected content"
        (ValueError("bug"), errno.EIO),
    ],
)
def test_errno_of(exc: BaseException, code: int) -> None:
    assert errno_of(exc) == code


def test_builtin_errno_slot_is_not_ours() -> None:
    # The trap: OSError's builtin errno slot stays None for an error built from a message, and
    # mfusepy answers such an error with EINVAL ("content refused"); errno_of() is the way.
    assert errors.KeyNotFound("a").errno is None
    assert errno_of(errors.KeyNotFound("a")) == errno.ENOENT


def test_rejected_message_names_path_format_and_rule() -> None:
    exc = errors.Rejected("decodes to 10 bytes", path="a/0.0", fmt="zarr2", rule="decoded-size")
    assert str(exc) == "a/0.0: decodes to 10 bytes [zarr2:decoded-size]"
    assert (exc.path, exc.fmt, exc.rule) == ("a/0.0", "zarr2", "decoded-size")
