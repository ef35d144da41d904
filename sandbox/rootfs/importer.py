"""``import``: a root filesystem from a file or directory instead of a registry.

Accepted: an OCI image layout directory (``skopeo copy ... oci:DIR``), a ``docker save`` /
``podman save`` archive (Docker's ``manifest.json`` format, or ``--format oci-archive``), and a
plain rootfs tarball (``tar -C rootfs -c .``, compressed or not). Image archives are opened into
a private temporary directory first (regular files only, names checked), their blobs are checked
against their digests, and the layers are unpacked like a pull's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from ..errors import RootfsError, UnsafeArchive
from . import unpack, untar
from .image import ImageConfig, host_platform
from .pull import choose, platform_of
from .store import Entry, Store

MAX_JSON = 8 << 20
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
        with tempfile.TemporaryDirectory(dir=store.root / "tmp", prefix="import-") as tmp:
            _open_archive(src, Path(tmp))
            return _import_dir(Path(tmp), src, name, store, platform, tag)
    with store.create(name, source=str(src), kind="import") as staging, open(src, "rb") as f:
        staging.add_stats(unpack.extract_tar(f, staging.tree))
    entry = store.get(name)
    assert entry is not None
    return entry


def _is_image_archive(path: Path) -> bool:
    """Read here, in the caller's process: headers as bounded as the unpack worker's."""
    with open(path, "rb") as f:
        for _, member in untar.members(f):
            if member.name.lstrip("./") in ("manifest.json", "oci-layout", "index.json"):
                return True
    return False


def _open_archive(path: Path, dest: Path) -> None:
    """Regular files and directories of an image archive, nothing else, nothing outside ``dest``."""
    with open(path, "rb") as f:
        for tf, member in untar.members(f):
            parts = untar.clean(member.name, member.name)
            if not parts:
                continue
            target = dest.joinpath(*parts)
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
            elif member.isreg():
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
                shutil.copyfile(dest.joinpath(*link), target)  # docker save links shared layers
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
    image = json.loads(_read_small(config))
    with store.create(name, source=str(origin), kind="import") as staging:
        staging.add_stats(unpack.extract_layers(layers, staging.tree))
        staging.config = ImageConfig.from_oci(image)
        staging.digest = digest
        staging.platform = platform_of(image)
    entry = store.get(name)
    assert entry is not None
    return entry


def _oci_layout(root: Path, platform: str, tag: str | None) -> tuple[list[Path], Path, str]:
    index = json.loads(_read_small(root / "index.json"))
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
        doc = json.loads(_read_small(_blob(root, digest)))
        if "manifests" in doc:
            desc = {"digest": choose(doc, platform, str(root))}
            continue
        break
    layers = [_blob(root, layer.get("digest")) for layer in doc.get("layers") or []]
    return layers, _blob(root, (doc.get("config") or {}).get("digest")), str(digest)


def _docker_archive(root: Path, tag: str | None) -> tuple[list[Path], Path, str]:
    manifest = json.loads(_read_small(root / "manifest.json"))
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
    digest = "sha256:" + hashlib.sha256(config.read_bytes()).hexdigest()
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
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    except FileNotFoundError:
        raise RootfsError(f"{root}: blob {digest} is missing") from None
    if "sha256:" + h.hexdigest() != digest:
        raise RootfsError(f"{root}: blob {digest} does not match its digest")
    return path


def _read_small(path: Path) -> bytes:
    if path.stat().st_size > MAX_JSON:
        raise RootfsError(f"{path} is larger than {MAX_JSON} bytes")
    return path.read_bytes()
