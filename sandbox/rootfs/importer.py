"""``import``: a root filesystem from a file or directory instead of a registry.

Accepted: an OCI image layout directory (``skopeo copy ... oci:DIR``), a ``docker save`` /
``podman save`` archive (Docker's ``manifest.json`` format, or ``--format oci-archive``), and a
plain rootfs tarball (``tar -C rootfs -c .``, compressed or not). Image archives are opened into
a private temporary directory first (regular files only, names checked; at most ``IMAGE_BLOB_MAX``
bytes a file and ``IMAGE_BLOBS_MAX`` in all, judged by each header before its data is copied, at
most ``IMAGE_ARCHIVE_MEMBERS_MAX`` members, and a link made as a link, never a copy), their blobs
are checked against their digests, and the layers are unpacked like a pull's. JSON documents are
read as a pull reads them (``image.parse_json``), and an image of more than ``IMAGE_LAYERS_MAX``
layers is refused. Runs in the caller's process; the temporary directory is locked while it is
used, so ``jailbox cleanup`` removes only a killed import's.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import RootfsError, UnsafeArchive
from ..limits import IMAGE_ARCHIVE_MEMBERS_MAX, IMAGE_BLOB_MAX, IMAGE_BLOBS_MAX, IMAGE_JSON_MAX, IMAGE_LAYERS_MAX
from . import unpack, untar
from .image import ImageConfig, host_platform, parse_json
from .pull import choose, platform_of
from .store import Entry, Store

REF_NAME = "org.opencontainers.image.ref.name"


def import_rootfs(
    source: str | Path, name: str, *, store: Store | None = None, platform: str | None = None, tag: str | None = None
) -> Entry:
    """Import ``source`` as ``name``; ``tag`` picks one image of an archive or layout holding several."""
    store = store or Store()
    try:
        return _import(Path(source).expanduser().absolute(), name, store, platform, tag)
    except untar.Unsafe as exc:
        raise UnsafeArchive(str(exc)) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        if isinstance(exc, RootfsError):
            raise
        raise RootfsError(f"{source}: not a usable image archive or layout ({type(exc).__name__}: {exc})") from None


def _import(src: Path, name: str, store: Store, platform: str | None, tag: str | None) -> Entry:
    if src.is_dir():
        if not (src / "oci-layout").is_file() and not (src / "manifest.json").is_file():
            raise RootfsError(f"{src} is neither an OCI image layout (no oci-layout file) nor a docker save directory")
        return _import_dir(src, src, name, store, platform, tag)
    if not src.is_file():
        raise RootfsError(f"{src} does not exist")
    if _is_image_archive(src):
        store.ensure()
        with _locked_tempdir(store.root / "tmp") as tmp:
            _open_archive(src, tmp)
            return _import_dir(tmp, src, name, store, platform, tag)
    with store.create(name, source=str(src), kind="import") as staging, open(src, "rb") as f:
        staging.add_stats(unpack.extract_tar(f, staging.tree))
    entry = store.get(name)
    assert entry is not None
    return entry


@contextlib.contextmanager
def _locked_tempdir(parent: Path) -> Iterator[Path]:
    """A private ``import-*`` directory under ``parent``, flocked while in use, removed after."""
    with tempfile.TemporaryDirectory(dir=parent, prefix="import-") as tmp:
        fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield Path(tmp)
        finally:
            os.close(fd)


def _is_image_archive(path: Path) -> bool:
    """Read here, in the caller's process: headers as bounded as the unpack worker's."""
    with open(path, "rb") as f:
        for _, member in untar.members(f):
            if member.name.lstrip("./") in ("manifest.json", "oci-layout", "index.json"):
                return True
    return False


def _open_archive(path: Path, dest: Path) -> None:
    """Regular files and directories of an image archive, nothing else, nothing outside ``dest``;
    at most ``IMAGE_BLOB_MAX`` bytes a file and ``IMAGE_BLOBS_MAX`` in all, judged before copying."""
    total = 0
    with open(path, "rb") as f:
        for count, (tf, member) in enumerate(untar.members(f), 1):
            if count > IMAGE_ARCHIVE_MEMBERS_MAX:
                raise RootfsError(
                    f"{member.name}: more than {IMAGE_ARCHIVE_MEMBERS_MAX} members in an image archive; refused"
                )
            parts = untar.clean(member.name, member.name)
            if not parts:
                continue
            target = dest.joinpath(*parts)
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
            elif member.isreg():
                if member.size > IMAGE_BLOB_MAX:
                    raise RootfsError(
                        f"{member.name}: {member.size} bytes, more than the {IMAGE_BLOB_MAX} a file of an image "
                        f"archive may have ({IMAGE_BLOB_MAX >> 30} GiB); refused"
                    )
                total += member.size
                if total > IMAGE_BLOBS_MAX:
                    raise RootfsError(
                        f"{member.name}: the archive's files pass {IMAGE_BLOBS_MAX} bytes in all "
                        f"({IMAGE_BLOBS_MAX >> 30} GiB); refused"
                    )
                target.parent.mkdir(parents=True, exist_ok=True)
                if target.parent.is_symlink() or target.is_symlink():
                    raise RootfsError(f"{member.name}: unexpected link in an image archive")
                src = tf.extractfile(member)
                assert src is not None
                with open(target, "xb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)
            elif member.issym() or member.islnk():
                link = untar.clean(member.name, member.linkname if member.islnk() else _join(parts, member.linkname))
                target.parent.mkdir(parents=True, exist_ok=True)
                source = dest.joinpath(*link)
                if source.is_symlink() or not source.is_file():
                    raise RootfsError(f"{member.name}: links to {member.linkname!r}, not a file before it")
                os.link(source, target)  # docker save links shared layers: one copy, however many links
            else:
                raise RootfsError(f"{member.name}: unexpected member type in an image archive")


def _join(parts: list[str], link: str) -> str:
    if link.startswith("/"):
        return link
    return os.path.normpath("/".join([*parts[:-1], link]))


def _import_dir(root: Path, origin: Path, name: str, store: Store, platform: str | None, tag: str | None) -> Entry:
    if (root / "oci-layout").is_file():
        layers, config, digest = _oci_layout(root, platform or host_platform(), tag)
    else:
        layers, config, digest = _docker_archive(root, tag)
    if len(layers) > IMAGE_LAYERS_MAX:
        raise RootfsError(f"{origin}: {len(layers)} layers, more than the {IMAGE_LAYERS_MAX} an image may have")
    image = _read_json(config)
    if not isinstance(image, dict):
        raise RootfsError(f"{origin}: its image config is not a JSON object")
    with store.create(name, source=str(origin), kind="import") as staging:
        staging.add_stats(unpack.extract_layers(layers, staging.tree))
        staging.config = ImageConfig.from_oci(image)
        staging.digest = digest
        staging.platform = platform_of(image)
    entry = store.get(name)
    assert entry is not None
    return entry


def _oci_layout(root: Path, platform: str, tag: str | None) -> tuple[list[Path], Path, str]:
    index = _read_json(root / "index.json")
    manifests = [m for m in index.get("manifests") or [] if isinstance(m, dict)]
    tags = [(m.get("annotations") or {}).get(REF_NAME) for m in manifests]
    if tag is not None:
        manifests = [m for m, t in zip(manifests, tags, strict=True) if t == tag]
    if not manifests:
        have = ", ".join(sorted(t for t in tags if t)) or "none"
        raise RootfsError(f"{root}: no image{f' tagged {tag!r}' if tag else ''} in index.json (tags: {have})")
    if len(manifests) > 1 and all(m.get("platform") for m in manifests):
        desc = {"digest": choose({"manifests": manifests}, platform, str(root))}
    elif len(manifests) > 1:
        raise RootfsError(
            f"{root} holds several images (tags: {', '.join(t or '?' for t in tags)}); pick one with --tag"
        )
    else:
        desc = manifests[0]
    while True:
        digest = desc.get("digest")
        doc = _read_json(_blob(root, digest))
        if "manifests" in doc:
            desc = {"digest": choose(doc, platform, str(root))}
            continue
        break
    layers = [_blob(root, layer.get("digest")) for layer in doc.get("layers") or []]
    return layers, _blob(root, (doc.get("config") or {}).get("digest")), str(digest)


def _docker_archive(root: Path, tag: str | None) -> tuple[list[Path], Path, str]:
    manifest = _read_json(root / "manifest.json")
    if not isinstance(manifest, list) or not all(isinstance(m, dict) for m in manifest):
        raise RootfsError(f"{root}: manifest.json is not a docker save manifest")
    tags = [t for m in manifest for t in (m.get("RepoTags") or [])]
    if tag is not None:
        manifest = [m for m in manifest if tag in (m.get("RepoTags") or [])]
    if len(manifest) != 1:
        raise RootfsError(
            f"{root}: {'no image' if not manifest else 'several images'}{f' tagged {tag!r}' if tag else ''} "
            f"in the archive (tags: {', '.join(tags) or 'none'}); pick one with --tag"
        )
    item = manifest[0]
    config = _inside(root, item.get("Config"))
    layers = [_inside(root, layer) for layer in item.get("Layers") or []]
    digest = _sha256(config)  # it names the image; what is parsed of it is bounded (_read_json)
    return layers, config, digest


def _inside(root: Path, rel: object) -> Path:
    if not isinstance(rel, str):
        raise RootfsError(f"{root}: manifest.json names a file badly: {rel!r}")
    path = root.joinpath(*untar.clean(rel, rel))
    if not path.is_file():
        raise RootfsError(f"{root}: {rel} is missing from the archive")
    return path


def _blob(root: Path, digest: object) -> Path:
    if not isinstance(digest, str) or not digest.startswith("sha256:") or len(digest) != 71:
        raise RootfsError(f"{root}: unsupported digest {digest!r}")
    path = root / "blobs" / "sha256" / digest[7:]
    try:
        got = _sha256(path)
    except FileNotFoundError:
        raise RootfsError(f"{root}: blob {digest} is missing") from None
    if got != digest:
        raise RootfsError(f"{root}: blob {digest} does not match its digest")
    return path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def _read_json(path: Path) -> Any:
    """A JSON document of the archive or layout, read no further than ``IMAGE_JSON_MAX`` bytes."""
    with open(path, "rb") as f:
        body = f.read(IMAGE_JSON_MAX + 1)
    return parse_json(body, str(path))
