"""Detection over datasets written by real writers, on file, zip and S3 stores."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest

from n5fs.detect import Detector, FolderKind, Listed, candidates, open_source
from n5fs.errors import DetectionFailed, InvalidSource
from n5fs.formats.registry import PROBE_NAMES
from n5fs.kvstore.file import FileStore
from n5fs.kvstore.memory import MemoryStore
from n5fs.testing.doubles import Call, Clock, CountingStore
from n5fs.validate import validate_store
from tests.writers import ramp, tensorstore_n5, tensorstore_zarr3, zarr_python_hierarchy


def zip_dir(src: Path, dest: Path, *, comment: bytes = b"") -> Path:
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_STORED) as zf:
        for path in sorted(src.rglob("*")):
            if path.is_file():
                zf.write(path, path.relative_to(src).as_posix())
        zf.comment = comment
    return dest


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("data")
    tensorstore_n5(root / "n5" / "vol", ramp((10, 12, 5)), [4, 4, 4])
    (root / "n5" / "attributes.json").write_text('{"n5": "4.0.0"}')
    zarr_python_hierarchy(root / "v2", 2)
    zarr_python_hierarchy(root / "v3", 3)
    tensorstore_zarr3(root / "sharded", ramp((16, 16)), [4, 4], shard=[8, 8])
    return root


@pytest.mark.parametrize(
    ("sub", "expected"),
    [
        ("n5", {"": ("n5", "group"), "vol/": ("n5", "array")}),
        (
            "v2",
            {
                "": ("zarr2", "group"),
                "raw/": ("zarr2", "array"),
                "labels/": ("zarr2", "group"),
                "labels/seg/": ("zarr2", "array"),
            },
        ),
        (
            "v3",
            {
                "": ("zarr3", "group"),
                "raw/": ("zarr3", "array"),
                "labels/": ("zarr3", "group"),
                "labels/seg/": ("zarr3", "array"),
            },
        ),
        ("sharded", {"": ("zarr3", "array")}),
    ],
)
def test_hierarchy_kinds(datasets: Path, sub: str, expected: dict[str, tuple[str, str]]) -> None:
    detector = Detector(FileStore(datasets / sub))
    found = {
        f.prefix: (f.fmt, f.kind.value) for f in detector.walk("") if f.kind is not FolderKind.PLAIN
    }
    assert found == expected


def test_chunk_folders_know_their_array(datasets: Path) -> None:
    detector = Detector(FileStore(datasets / "n5"))
    folder = detector.folder("vol/0/1/")
    assert folder.kind is FolderKind.CHUNKS
    assert folder.array_prefix == "vol/"
    owner = detector.owner("vol/0/1/0")
    assert owner.kind is FolderKind.ARRAY
    assert owner.array is not None
    assert owner.array.shape == (10, 12, 5)


def test_n5_folder_without_attributes_is_an_implicit_group(datasets: Path, tmp_path: Path) -> None:
    shutil.copytree(datasets / "n5", tmp_path / "n5")
    (tmp_path / "n5" / "nested" / "deeper").mkdir(parents=True)
    shutil.copytree(datasets / "n5" / "vol", tmp_path / "n5" / "nested" / "deeper" / "vol")
    detector = Detector(FileStore(tmp_path / "n5"))
    assert detector.folder("nested/").kind is FolderKind.GROUP
    assert detector.folder("nested/deeper/vol/").kind is FolderKind.ARRAY


def test_plain_root_with_datasets_below(datasets: Path) -> None:
    detector = Detector(FileStore(datasets))
    kinds = {f.prefix: f.kind for f in detector.walk("")}
    assert kinds[""] is FolderKind.PLAIN
    assert kinds["v2/raw/"] is FolderKind.ARRAY
    assert kinds["n5/vol/"] is FolderKind.ARRAY


def test_ambiguity_names_the_candidates() -> None:
    store = MemoryStore()
    store.set(".zgroup", b'{"zarr_format": 2}')
    store.set("zarr.json", b'{"zarr_format": 3, "node_type": "group"}')
    with pytest.raises(DetectionFailed) as info:
        Detector(store).folder("")
    assert "zarr2" in str(info.value)
    assert "zarr3" in str(info.value)


def test_nothing_found_is_plain() -> None:
    store = MemoryStore()
    store.set("README", b"hello")
    assert Detector(store).folder("").kind is FolderKind.PLAIN
    assert candidates({}) == []


def test_invalidate_on_metadata_change_only() -> None:
    store = MemoryStore()
    detector = Detector(store)
    assert detector.folder("a/").kind is FolderKind.PLAIN
    store.set("a/.zgroup", b'{"zarr_format": 2}')
    assert detector.folder("a/").kind is FolderKind.PLAIN  # cached
    assert detector.invalidate("a/README") == 0
    assert detector.invalidate("a/.zgroup") >= 1
    assert detector.folder("a/").kind is FolderKind.GROUP


def test_ttl_expiry_uses_the_injected_clock() -> None:
    now = [0.0]
    store = MemoryStore()
    detector = Detector(store, ttl=5.0, clock=lambda: now[0])
    assert detector.folder("").kind is FolderKind.PLAIN
    store.set(".zgroup", b'{"zarr_format": 2}')
    now[0] = 4.9
    assert detector.folder("").kind is FolderKind.PLAIN
    now[0] = 5.0
    assert detector.folder("").kind is FolderKind.GROUP


@pytest.mark.parametrize("comment", [b"", b"c" * 65_000])
def test_zip_file_source_is_detected(datasets: Path, tmp_path: Path, comment: bytes) -> None:
    archive = zip_dir(datasets / "v2", tmp_path / "v2.zip", comment=comment)
    source = open_source(str(archive))
    assert source.container == "zip"
    kinds = {f.prefix: f.kind for f in Detector(source.store).walk("")}
    assert kinds["raw/"] is FolderKind.ARRAY


def test_single_non_zip_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a store")
    with pytest.raises(InvalidSource, match="not a zip archive"):
        open_source(str(tmp_path / "notes.txt"))


@pytest.mark.s3
def test_zip_inside_s3(datasets: Path, tmp_path: Path, s3_server, s3_bucket: str) -> None:
    archive = zip_dir(datasets / "n5", tmp_path / "n5.zip")
    s3_server.client().upload_file(str(archive), s3_bucket, "data/n5.zip")
    spec = {
        "driver": "s3",
        "bucket": s3_bucket,
        "path": "data/n5.zip",
        "endpoint": s3_server.endpoint,
    }
    source = open_source(json.dumps(spec))
    assert source.container == "zip"
    vol = Detector(source.store).folder("vol/")
    assert vol.kind is FolderKind.ARRAY
    assert vol.fmt == "n5"
    report = validate_store(source.store)  # validate works on a zip inside S3 too
    assert report.invalid == []
    assert report.chunks == 3 * 3 * 2


# -- probes a listing answers (Detector(listed=...)) ----------------------------------------------

ZGROUP = b'{"zarr_format": 2}'
ZARRAY = json.dumps(
    {"zarr_format": 2, "shape": [4], "chunks": [2], "dtype": "<u2", "compressor": None,
     "fill_value": 0, "order": "C", "filters": None}
).encode()  # fmt: skip


def test_probes_only_what_the_listing_holds_and_not_what_is_held() -> None:
    store = CountingStore(MemoryStore())
    store.inner.set("g/.zgroup", ZGROUP)
    store.inner.set("a/.zarray", ZARRAY)
    listings = {
        "": Listed(frozenset({"README"}), until=10.0),
        "g/": Listed(frozenset({".zgroup"}), until=10.0),
        "a/": Listed(frozenset({".zarray"}), until=10.0, held={".zarray": ZARRAY}),
    }
    detector = Detector(store, ttl=5.0, clock=Clock(), listed=listings.get)
    assert detector.folder("").kind is FolderKind.PLAIN
    assert store.count() == 0  # the listing holds no probe name: no request
    assert detector.folder("g/").kind is FolderKind.GROUP
    assert store.calls_of("get_many") == [Call("get_many", ("g/.zgroup",))]
    store.clear()
    assert detector.folder("a/").kind is FolderKind.ARRAY
    assert store.count() == 0  # the owner held the bytes
    assert detector.probe("a/") == {".zarray": ZARRAY}
    # a folder no listing knows is probed whole, as without ``listed``
    assert detector.folder("b/").kind is FolderKind.PLAIN
    assert len(store.calls_of("get_many")[0].keys) == len(PROBE_NAMES)


def test_an_answer_from_a_listing_expires_with_the_listing() -> None:
    """Another writer's metadata is seen once the listing that left it out expires, not a
    TTL after the detection that went by that listing."""
    clock = Clock()
    store = MemoryStore()
    listed = {"": Listed(frozenset(), until=2.0)}
    detector = Detector(store, ttl=5.0, clock=clock, listed=lambda p: listed.get(p))
    clock.now = 1.0
    assert detector.folder("").kind is FolderKind.PLAIN
    store.set(".zgroup", ZGROUP)  # someone else
    clock.now = 1.9
    assert detector.folder("").kind is FolderKind.PLAIN  # cached, the listing still fresh
    clock.now = 2.0  # the listing expired (the owner answers None from now on)
    listed.clear()
    assert detector.folder("").kind is FolderKind.GROUP


def test_an_invalidation_while_a_listing_is_read_grounds_the_detection() -> None:
    """The owner patches its listing, then invalidates: a detection that read the listing
    before the change is handed to its caller but never stored."""
    store = MemoryStore()
    names: set[str] = set()
    detector: Detector

    def listed(prefix: str) -> Listed:
        seen = Listed(frozenset(names), until=100.0)
        if not names:  # the first detection read the listing; now the change lands
            store.set(".zgroup", ZGROUP)
            names.add(".zgroup")
            detector.invalidate(".zgroup")
        return seen

    detector = Detector(store, ttl=5.0, clock=Clock(), listed=listed)
    assert detector.folder("").kind is FolderKind.PLAIN  # began before the change
    assert detector.folder("").kind is FolderKind.GROUP  # not stored: detected again
