"""Crafted malicious archives: each trick is refused with an error naming the member, and nothing
is written outside the target (the worker runs inside the jail's id map, as root inside)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from support.oci_images import E, raw_header, raw_tar_gz, tar_bytes

from jailbox.sandbox.errors import RootfsError, UnsafeArchive
from jailbox.sandbox.rootfs import unpack


@pytest.fixture
def area(tmp_path: Path):
    """``tree`` (the target) next to ``outside`` (a directory the archive must not reach)."""
    tree, outside = tmp_path / "tree", tmp_path / "outside"
    tree.mkdir()
    outside.mkdir()
    (outside / "victim").write_text("untouched\n")
    yield tree, outside
    unpack.rmtree(tree)  # may hold files of subordinate ids


def snapshot(path: Path) -> dict[str, bytes | None]:
    out = {}
    for top, dirs, files in os.walk(path):
        for name in dirs + files:
            p = Path(top) / name
            out[str(p.relative_to(path))] = p.read_bytes() if p.is_file() and not p.is_symlink() else None
    return out


def layers(tmp_path: Path, *layer_entries: list[E]) -> list[Path]:
    paths = []
    for i, entries in enumerate(layer_entries):
        path = tmp_path / f"layer{i}.tar"
        path.write_bytes(tar_bytes(entries))
        paths.append(path)
    return paths


ATTACKS = {
    "dotdot": ([E("../outside/evil", data=b"x")], "../outside/evil: '..' in its path"),
    "dotdot_inner": ([E("a/../../outside/evil", data=b"x")], "a/../../outside/evil: '..' in its path"),
    "absolute": ([E("/tmp/evil-abs", data=b"x")], "/tmp/evil-abs: absolute path"),
    "symlink_escape_relative": (
        [E("link", "symlink", link="../outside"), E("link/evil", data=b"x")],
        "link/evil: its path goes through a symbolic link that leaves the tree",
    ),
    "symlink_escape_after_absolute": (
        [E("b", "dir"), E("a", "symlink", link="/b"), E("b/up", "symlink", link="../.."), E("a/up/evil")],
        "a/up/evil: its path goes through a symbolic link that leaves the tree",
    ),
    "symlink_loop": (
        [E("l1", "symlink", link="l2"), E("l2", "symlink", link="/l1"), E("l1/evil")],
        "l1/evil: its path goes through a symbolic link loop",
    ),
    "symlink_to_nothing": (
        [E("var/run", "symlink", link="/run"), E("var/run/evil")],
        "var/run/evil: its path goes through a symbolic link that leads nowhere",
    ),
    "symlink_chain": (
        [E("a", "dir"), E("a/up", "symlink", link=".."), E("a/up/up", "symlink", link=".."), E("a/up/up/evil")],
        "a/up/up/evil: its path goes through a symbolic link that leaves the tree",
    ),
    "hardlink_outside_relative": (
        [E("h", "hardlink", link="../outside/victim")],
        "h: '..' in its path",
    ),
    "hardlink_outside_absolute": (
        [E("h", "hardlink", link="/etc/passwd")],
        "h: absolute path",
    ),
    "hardlink_through_symlink": (
        [E("l", "symlink", link="../outside"), E("h", "hardlink", link="l/victim")],
        "h: its path goes through a symbolic link that leaves the tree",
    ),
    "huge_member": ([E("huge", data=b"x" * 10, size=10**15)], "huge: claims 1000000000000000 bytes"),
    "truncated": (tar_bytes([E("short", data=b"x" * 5000)])[: 512 + 1000], "short: the archive ends inside its data"),
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_malicious_member_is_refused_and_nothing_leaves_the_tree(area, tmp_path: Path, name: str) -> None:
    tree, outside = area
    entries, message = ATTACKS[name]
    before = snapshot(tmp_path)
    with pytest.raises(UnsafeArchive) as info:
        unpack.extract_tar(io.BytesIO(entries if isinstance(entries, bytes) else tar_bytes(entries)), tree)
    assert message in str(info.value)
    after = snapshot(tmp_path)
    assert {k: v for k, v in after.items() if not k.startswith("tree/")} == {
        k: v for k, v in before.items() if not k.startswith("tree/")
    }
    assert (outside / "victim").read_text() == "untouched\n"
    assert not os.path.exists("/tmp/evil-abs") and not os.path.exists("/tmp/evil")


def test_symlink_planted_by_an_earlier_layer_cannot_be_written_through(area, tmp_path: Path) -> None:
    tree, outside = area
    paths = layers(
        tmp_path,
        [E("usr", "dir"), E("usr/lib", "symlink", link="../../outside")],
        [E("usr/lib/evil", data=b"x")],
    )
    with pytest.raises(UnsafeArchive, match="usr/lib/evil: its path goes through a symbolic link that leaves"):
        unpack.extract_layers(paths, tree)
    assert sorted(os.listdir(outside)) == ["victim"]


def test_a_symlink_in_the_final_component_is_replaced_not_followed(area) -> None:
    tree, outside = area
    entries = [E("victim", "symlink", link="../outside/victim"), E("victim", data=b"replaced")]
    unpack.extract_tar(io.BytesIO(tar_bytes(entries)), tree)
    assert (outside / "victim").read_text() == "untouched\n"
    assert not (tree / "victim").is_symlink() and (tree / "victim").read_bytes() == b"replaced"


def test_symlinks_that_stay_inside_are_followed_and_kept(area) -> None:
    tree, _ = area
    entries = [E("usr/lib", "dir"), E("lib", "symlink", link="usr/lib"), E("lib/x.so", data=b"so")]
    unpack.extract_tar(io.BytesIO(tar_bytes(entries)), tree)
    assert (tree / "usr/lib/x.so").read_bytes() == b"so"


def test_an_absolute_symlink_from_an_earlier_layer_is_followed_from_the_trees_root(area, tmp_path: Path) -> None:
    """Ubuntu's /var/run -> /run: what the jail sees as /var/run/foo is <tree>/run/foo."""
    tree, outside = area
    paths = layers(
        tmp_path,
        [E("run", "dir"), E("var", "dir"), E("var/run", "symlink", link="/run")],
        [E("var/run/foo", data=b"pid"), E("var/run/sub/bar", data=b"deeper")],
    )
    unpack.extract_layers(paths, tree)
    assert (tree / "run/foo").read_bytes() == b"pid" and (tree / "run/sub/bar").read_bytes() == b"deeper"
    assert os.readlink(tree / "var/run") == "/run"
    assert sorted(os.listdir(outside)) == ["victim"]


def test_a_chain_of_absolute_and_relative_symlinks_resolves_inside(area) -> None:
    tree, _ = area
    entries = [
        E("c", "dir"),
        E("b", "symlink", link="c"),
        E("a", "symlink", link="/b"),
        E("a/x", data=b"x"),
        E("a/d", "dir"),
        E("usr/lib64/ld.so", data=b"ld"),
        E("lib64", "symlink", link="/usr/lib64"),
        E("h", "hardlink", link="lib64/ld.so"),
    ]
    unpack.extract_tar(io.BytesIO(tar_bytes(entries)), tree)
    assert (tree / "c/x").read_bytes() == b"x" and os.readlink(tree / "a") == "/b" and os.readlink(tree / "b") == "c"
    assert (tree / "c/d").stat().st_mtime == 1700000000  # directory times reach it through the links too
    assert (tree / "h").stat().st_ino == (tree / "usr/lib64/ld.so").stat().st_ino


def test_dotdot_at_the_root_of_an_absolute_symlink_stays_at_the_root(area) -> None:
    """As the kernel does for ``/..`` (and so the jail): never above the tree."""
    tree, outside = area
    entries = [
        E("etc", "dir"),
        E("up", "symlink", link="/../../etc"),
        E("up/x", data=b"x"),
        E("abs", "symlink", link="/"),
        E("abs/tmp/evil", data=b"x"),
    ]
    unpack.extract_tar(io.BytesIO(tar_bytes(entries)), tree)
    assert (tree / "etc/x").read_bytes() == b"x" and (tree / "tmp/evil").read_bytes() == b"x"
    assert sorted(os.listdir(outside)) == ["victim"] and not os.path.exists("/tmp/evil")


@pytest.mark.root
def test_walking_symlinks_leaves_no_descriptor_open(area) -> None:
    """The engine in this process (root: it chowns to 0), through every refusal path."""
    from jailbox.sandbox.rootfs import untar

    tree, _ = area
    archives = [entries for entries, _ in ATTACKS.values() if not isinstance(entries, bytes)]
    archives.append([E("c", "dir"), E("a", "symlink", link="/../c"), E("a/b/x", data=b"x"), E("a/b", "dir")])
    before = sorted(os.listdir("/proc/self/fd"))
    for entries in archives:
        ex = untar.Extractor(
            str(tree), layer=True, max_id=65535, flatten=False, limits=untar.ArchiveBounds(10**9, 10**9, 100)
        )
        try:
            ex.extract(io.BytesIO(tar_bytes(entries)))
        except untar.Failed:
            pass
        finally:
            ex.close()
    assert sorted(os.listdir("/proc/self/fd")) == before
    assert (tree / "c/b/x").read_bytes() == b"x"


def test_device_nodes_are_skipped_and_reported(area) -> None:
    tree, _ = area
    result = unpack.extract_tar(io.BytesIO(tar_bytes([E("dev/evil-null", "chr"), E("ok", data=b"1")])), tree)
    assert result["skipped"] == ["dev/evil-null: device node"]
    assert not (tree / "dev/evil-null").exists() and (tree / "ok").exists()


def test_too_many_members_is_refused(area) -> None:
    tree, _ = area
    entries = [E(f"f{i}", data=b"") for i in range(20)]
    with pytest.raises(UnsafeArchive, match="f10: more than 10 members"):
        unpack.extract_tar(io.BytesIO(tar_bytes(entries)), tree, max_entries=10)


def test_total_size_is_bounded(area) -> None:
    tree, _ = area
    entries = [E(f"f{i}", data=b"x" * 1000) for i in range(5)]
    with pytest.raises(UnsafeArchive, match="f3: the archive exceeds 3500 bytes in total"):
        unpack.extract_tar(io.BytesIO(tar_bytes(entries)), tree, max_total=3500)


def test_setuid_bits_are_kept_for_the_jail(area) -> None:
    """Kept on purpose: jails run commands with no_new_privs (the kernel ignores the bits) and the
    store is 0700, so no other host user can execute them."""
    tree, _ = area
    unpack.extract_tar(io.BytesIO(tar_bytes([E("su", data=b"x", mode=0o4755), E("sg", data=b"x", mode=0o2755)])), tree)
    assert oct((tree / "su").stat().st_mode & 0o7777) == "0o4755"
    assert oct((tree / "sg").stat().st_mode & 0o7777) == "0o2755"


def test_garbage_is_not_a_tar(area) -> None:
    tree, _ = area
    with pytest.raises(RootfsError, match="not a readable tar stream"):
        unpack.extract_tar(io.BytesIO(b"\x00garbage" * 100), tree)


def test_plain_stream_from_a_pipe(area) -> None:
    """What a build does: a producer's stdout handed straight to the worker."""
    import subprocess
    import sys

    tree, _ = area
    data = tar_bytes([E("etc/hostname", data=b"piped\n"), E("root", "dir", mode=0o700)])
    code = "import sys; sys.stdout.buffer.write(sys.stdin.buffer.read())"
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(data)
    proc.stdin.close()
    result = unpack.extract_tar(proc.stdout, tree)
    proc.wait()
    assert result["entries"] == 2 and (tree / "etc/hostname").read_bytes() == b"piped\n"


def test_an_opaque_directory_keeps_what_its_own_layer_put_there(area, tmp_path: Path) -> None:
    tree, _ = area
    paths = layers(
        tmp_path,
        [E("d/old/x", data=b"lower"), E("d/keep-not", data=b"lower")],
        [E("d/old/new", data=b"this layer"), E("d/.wh..wh..opq")],
    )
    unpack.extract_layers(paths, tree)
    assert sorted(os.listdir(tree / "d")) == ["old"] and os.listdir(tree / "d/old") == ["new"]


@pytest.mark.slow
def test_a_whiteout_removes_a_deep_tree_without_following_its_links(area, tmp_path: Path) -> None:
    """Deeper than Python's recursion limit, with a link out of the tree inside: all of it goes,
    nothing outside does."""
    tree, outside = area
    deep = "/".join(["d"] * 1200)
    paths = layers(
        tmp_path,
        [E(f"gone/{deep}/file", data=b"x"), E("gone/out", "symlink", link=str(outside)), E("keep", data=b"k")],
        [E(".wh.gone")],
    )
    unpack.extract_layers(paths, tree)
    assert sorted(os.listdir(tree)) == ["keep"]
    assert sorted(os.listdir(outside)) == ["victim"]


# --- hostile headers: the worker's memory stays bounded (issue 37, section 4) ---------------------

WORKER_RSS_MAX_KB = 100 << 10  # an unpack worker at rest peaks near 20 MiB; these attacks ask for hundreds
BOUNDED_PARSE_RSS_MAX_KB = 160 << 10  # the worst the header bounds let through, with slack
CLAIM = 256 << 20  # what each hostile header claims; the unbounded parse held twice that or more
_SPARSE_WHY = "sparse files are refused: their maps are unbounded"


def _records(*pairs: tuple[str, str]) -> bytes:
    """PAX records, each ``"<length> key=value\\n"`` with the length counting itself."""
    out = b""
    for key, value in pairs:
        body = f" {key}={value}\n".encode()
        n = len(body) + len(str(len(body)))
        n = len(body) + len(str(n))  # one more digit when the count itself carries it over
        out += str(n).encode() + body
    return out


def _worker_peak(path: Path, tree: Path) -> tuple[str, int]:
    """Extract ``path`` from a process of its own; what it said and its unpack worker's peak RSS
    (KiB): RUSAGE_CHILDREN of that process counts only the worker."""
    code = (
        "import resource, sys\n"
        "from jailbox.sandbox.errors import RootfsError\n"
        "from jailbox.sandbox.rootfs import unpack\n"
        "try:\n"
        "    with open(sys.argv[1], 'rb') as f: print('ok', unpack.extract_tar(f, sys.argv[2])['entries'])\n"
        "except RootfsError as exc: print(type(exc).__name__, exc)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(path), str(tree)], capture_output=True, text=True, check=True)
    said, peak = out.stdout.rstrip("\n").rsplit("\n", 1)
    return said, int(peak)


def _file(name: str, data: bytes = b"") -> bytes:
    """A regular member, raw: header and padded data (no end-of-archive blocks)."""
    return raw_header(name, tarfile.REGTYPE, len(data)) + data + bytes(-len(data) % 512)


def _sparse_ext_block() -> bytes:
    """A GNU sparse extension block: 21 (offset, length) pairs and "another block follows"."""
    return (b"%011o\0%011o\0" % (1, 1)) * 21 + b"\x01" + bytes(7)


REG = raw_header("after", tarfile.REGTYPE, 0)
TINY = b"6 a=b\n" * ((1 << 20) // 6)
SPARSE_10 = _records(("GNU.sparse.major", "1"), ("GNU.sparse.minor", "0"))
SPARSE_10_MAP = b"8388608\n" + b"1\n" * (16 << 20)  # 8 million (offset, length) pairs
HEADER_ATTACKS = {
    "gnu_long_name": (
        [raw_header("././@LongLink", tarfile.GNUTYPE_LONGNAME, CLAIM), (bytes(1 << 20), CLAIM >> 20), REG],
        f"(the first member): a GNU long-name header claims {CLAIM} bytes, more than the 4097 it may take",
    ),
    "gnu_long_link": (
        [raw_header("././@LongLink", tarfile.GNUTYPE_LONGLINK, CLAIM), (bytes(1 << 20), CLAIM >> 20), REG],
        f"(the first member): a GNU long-link header claims {CLAIM} bytes, more than the 4097 it may take",
    ),
    "pax_extended": (
        [raw_header("PaxHeader/after", tarfile.XHDTYPE, CLAIM), (bytes(1 << 20), CLAIM >> 20), REG],
        f"(the first member): a PAX header claims {CLAIM} bytes, more than the 1048576 it may take",
    ),
    "pax_global": (
        [raw_header("pax_global_header", tarfile.XGLTYPE, CLAIM), (bytes(1 << 20), CLAIM >> 20), REG],
        f"(the first member): a global PAX header claims {CLAIM} bytes, more than the 1048576 it may take",
    ),
    "pax_many_records": (  # 16 MiB of 6-byte records: tarfile keeps a tuple for each
        [raw_header("PaxHeader/after", tarfile.XHDTYPE, len(TINY) * 16), (TINY, 16), REG],
        "(the first member): a PAX header claims",
    ),
    "gnu_sparse_map": (  # 200k extension blocks: 4.2 million map entries
        [
            raw_header("sparse", tarfile.GNUTYPE_SPARSE, 0, {482: b"\x01"}),  # isextended: blocks follow
            (_sparse_ext_block(), 200_000),
            _sparse_ext_block()[:504],
            REG,
        ],
        f"(the first member): a GNU sparse header ({_SPARSE_WHY})",
    ),
    "pax_sparse_map": (  # sparse 1.0: the map is the start of the member's data
        [
            raw_header("PaxHeader/sparse", tarfile.XHDTYPE, len(SPARSE_10)),
            SPARSE_10,
            raw_header("sparse", tarfile.REGTYPE, len(SPARSE_10_MAP)),
            SPARSE_10_MAP,
            REG,
        ],
        f"sparse: a PAX sparse file ({_SPARSE_WHY})",
    ),
}


@pytest.mark.parametrize("name", sorted(HEADER_ATTACKS))
def test_a_hostile_header_is_refused_before_it_is_read(area, tmp_path: Path, name: str) -> None:
    """Each header claims or makes hundreds of MiB of parse from a few MiB of gzip; the bounded
    parse refuses it by its declared size, and the worker stays near its resting size."""
    tree, outside = area
    parts, message = HEADER_ATTACKS[name]
    said, peak = _worker_peak(raw_tar_gz(tmp_path / f"{name}.tar.gz", *parts), tree)
    assert said.startswith(f"UnsafeArchive {message}"), f"{said} (the worker peaked at {peak} KiB)"
    assert peak < WORKER_RSS_MAX_KB, f"the worker peaked at {peak} KiB"
    assert snapshot(tree) == {} and snapshot(outside) == {"victim": b"untouched\n"}


def test_the_costliest_headers_the_bounds_allow_cost_a_bounded_parse(area, tmp_path: Path) -> None:
    """Four PAX headers of 1 MiB of tiny distinct records before one member, all the bounds let
    through: tarfile keeps objects for each record (measured: the worker peaks near 105 MiB)."""
    tree, _ = area
    records = b"".join(_records((f"k{i}", "b")) for i in range(120_000))
    records = records[: records.rfind(b"\n", 0, 1 << 20) + 1]
    one = raw_header("PaxHeader/after", tarfile.XHDTYPE, len(records)) + records + bytes(-len(records) % 512)
    path = tmp_path / "records.tar"
    path.write_bytes(one * 4 + _file("after") + bytes(1024))
    said, peak = _worker_peak(path, tree)
    assert said == "ok 1" and peak < BOUNDED_PARSE_RSS_MAX_KB, f"{said} (the worker peaked at {peak} KiB)"


def test_a_pax_record_longer_than_its_header_is_refused_not_taken_for_the_end(area) -> None:
    """tarfile takes a malformed header after the first for the end of the archive: the tree would
    be cut short without a word."""
    tree, _ = area
    record = b"99999999999 path=x\n"
    bad = raw_header("PaxHeader/evil", tarfile.XHDTYPE, len(record)) + record + bytes(-len(record) % 512)
    data = _file("first", b"1") + bad + _file("evil") + bytes(1024)
    with pytest.raises(UnsafeArchive, match=r"^\(the member after first\): a malformed PAX header \(invalid header\)$"):
        unpack.extract_tar(io.BytesIO(data), tree)


@pytest.mark.parametrize(
    "record",
    [b"3 path=x\n", b"18 path=x\n" + bytes(9), b"10 pathx=!", b"9 pathx\n", b"x9 path=x\n", b"19 path=x\n"],
    ids=["shorter", "past-its-newline", "no-newline", "no-equals", "no-length", "past-the-header"],
)
def test_a_malformed_pax_record_is_refused_whichever_python_parses_it(area, record: bytes) -> None:
    """Python 3.11.2's tarfile refuses these and 3.11.7's takes some (the padding as a value): the
    records are judged before either reads them."""
    tree, _ = area
    bad = raw_header("PaxHeader/evil", tarfile.XHDTYPE, len(record)) + record + bytes(-len(record) % 512)
    with pytest.raises(UnsafeArchive, match=r"^\(the first member\): a malformed PAX header \(invalid header\)$"):
        unpack.extract_tar(io.BytesIO(bad + _file("evil") + bytes(1024)), tree)
    assert not (tree / "evil").exists()
    good = b"11 path=ok\n"
    fine = raw_header("PaxHeader/ok", tarfile.XHDTYPE, len(good) + 3) + good + bytes(512 - len(good))
    unpack.extract_tar(io.BytesIO(fine + _file("evil") + bytes(1024)), tree)  # NUL padding after the records
    assert (tree / "ok").exists()


@pytest.mark.parametrize("mtime", ["1e999", "nan"])
def test_a_pax_time_out_of_range_is_refused_naming_the_member(area, mtime: str) -> None:
    tree, _ = area
    pax = _records(("mtime", mtime))
    data = raw_header("PaxHeader/t", tarfile.XHDTYPE, len(pax)) + pax + bytes(-len(pax) % 512)
    with pytest.raises(UnsafeArchive, match=r"^t: a header field out of range \(cannot convert float"):
        unpack.extract_tar(io.BytesIO(data + _file("t", b"1") + bytes(1024)), tree)


def test_a_chain_of_extension_headers_is_refused(area) -> None:
    """tarfile reads such a chain recursively, holding every header until the member."""
    tree, _ = area
    pax = _records(("comment", "x" * 1000))
    one = raw_header("PaxHeader/evil", tarfile.XHDTYPE, len(pax)) + pax + bytes(-len(pax) % 512)
    data = one * 5 + _file("evil") + bytes(1024)
    with pytest.raises(UnsafeArchive, match=r"^\(the first member\): more than 4 extension headers before one member$"):
        unpack.extract_tar(io.BytesIO(data), tree)
    unpack.extract_tar(io.BytesIO(one * 4 + _file("fine") + bytes(1024)), tree)
    assert (tree / "fine").exists()


def test_global_pax_headers_share_one_bound(area) -> None:
    """Each global header is kept for the rest of the stream, so together they take one budget."""
    tree, _ = area
    pax = _records(("comment", "x" * (600 << 10)))
    glob = raw_header("pax_global_header", tarfile.XGLTYPE, len(pax)) + pax + bytes(-len(pax) % 512)
    data = glob + _file("a", b"1") + glob + _file("b") + bytes(1024)
    refused = r"^\(the member after a\): global PAX headers take more than 1048576 bytes in all$"
    with pytest.raises(UnsafeArchive, match=refused):
        unpack.extract_tar(io.BytesIO(data), tree)


def test_a_huge_member_in_a_small_compressed_tar_is_held_to_the_disk_bounds(area, tmp_path: Path) -> None:
    """A few MiB of gzip declare 100 GiB, or hold 512 MiB of zeros: the member and total bounds
    refuse them before a byte is written."""
    tree, _ = area
    huge = raw_tar_gz(tmp_path / "huge.tar.gz", raw_header("huge", tarfile.REGTYPE, 100 << 30), (bytes(1 << 20), 4))
    with pytest.raises(UnsafeArchive, match=r"^huge: claims 107374182400 bytes, more than the limit of 68719476736$"):
        with huge.open("rb") as f:
            unpack.extract_tar(f, tree)
    zeros = raw_tar_gz(
        tmp_path / "zeros.tar.gz",
        raw_header("a", tarfile.REGTYPE, 8 << 20),
        (bytes(1 << 20), 8),
        raw_header("b", tarfile.REGTYPE, 512 << 20),
        (bytes(1 << 20), 512),
    )
    assert zeros.stat().st_size < 4 << 20
    with pytest.raises(UnsafeArchive, match=r"^b: the archive exceeds 67108864 bytes in total$"):
        with zeros.open("rb") as f:
            unpack.extract_tar(f, tree, max_total=64 << 20)
    assert not (tree / "b").exists() and unpack.du(tree)["bytes"] == 8 << 20


def test_the_unpack_worker_has_a_memory_bound_of_its_own(area) -> None:
    """Whatever a parse escapes the header bounds, the worker's RLIMIT_DATA holds it (worker.MEMORY_MAX)."""
    import threading

    import psutil

    from jailbox.sandbox.rootfs import worker

    tree, _ = area
    r, w = os.pipe()
    done: list[object] = []
    with open(r, "rb") as stream:
        t = threading.Thread(target=lambda: done.append(unpack.extract_tar(stream, tree)))
        t.start()
        try:
            workers: list[psutil.Process] = []
            while not workers and t.is_alive():
                workers = [p for p in psutil.Process().children() if "sandbox.rootfs.worker" in " ".join(p.cmdline())]
            wchan = Path(f"/proc/{workers[0].pid}/wchan")
            while t.is_alive() and "pipe_read" not in wchan.read_text():  # main() runs before it reads a pipe
                pass
            limits = Path(f"/proc/{workers[0].pid}/limits").read_text()
        finally:
            os.write(w, tar_bytes([E("ok", data=b"1")]))
            os.close(w)
            t.join()
    line = next(x for x in limits.splitlines() if x.startswith("Max data size"))
    assert line.split()[3:5] == [str(worker.MEMORY_MAX)] * 2, line
    assert worker.MEMORY_MAX == 1 << 30 and done and (tree / "ok").exists()
