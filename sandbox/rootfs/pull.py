"""``pull``: an image from a registry into the store, without Docker.

Index (manifest list) -> the manifest for the wanted platform (the host's by default) -> config
and layer blobs through the blob cache (verified, resumable, shared between images) -> layers
unpacked in order into a staging tree -> renamed into place with the image config. A second pull of
the same image (same manifest digest and platform) finds the entry and downloads nothing.

Runs in the caller's process. What the registry declares is judged before anything is fetched (the
bounds are in ``sandbox/limits``): at most ``IMAGE_LAYERS_MAX`` layers, each blob at most
``IMAGE_BLOB_MAX`` bytes and all together at most ``IMAGE_BLOBS_MAX``, the config at most
``IMAGE_JSON_MAX``; then no blob is written past the size its descriptor declares (``blobs.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from ..errors import DownloadInterrupted, RegistryError
from ..limits import IMAGE_BLOB_MAX, IMAGE_BLOBS_MAX, IMAGE_JSON_MAX, IMAGE_LAYERS_MAX
from . import unpack
from .blobs import BlobCache, Progress
from .image import ImageConfig, host_platform, matches, parse_json
from .reference import Reference
from .registry import INDEX_TYPES, Registry
from .store import Entry, Store

ATTEMPTS = 4
LAYER_TYPES = (
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
    "application/vnd.docker.image.rootfs.diff.tar",
)
Log = Callable[[str], None]


def pull(
    ref_text: str,
    name: str | None = None,
    *,
    platform: str | None = None,
    insecure: bool = False,
    store: Store | None = None,
    progress: Progress | None = None,
    log: Log | None = None,
) -> Entry:
    """Pull ``ref_text`` into the store as ``name`` (default: the canonical reference)."""
    ref = Reference.parse(ref_text)
    store = store or Store()
    name = name or str(ref)
    wanted = platform or host_platform()
    say = log or (lambda _msg: None)
    with Registry(ref, insecure=insecure) as reg:
        manifest, media, digest = reg.manifest(ref.object)
        if media in INDEX_TYPES or "manifests" in manifest:
            digest = choose(manifest, wanted, str(ref))
            manifest, media, _ = reg.manifest(digest)
        existing = store.get(name)
        if existing is not None and existing.digest == digest:
            say(f"{name}: up to date ({digest})")
            return existing
        layers = manifest.get("layers")
        config = manifest.get("config")
        if not isinstance(layers, list) or not isinstance(config, dict):
            raise RegistryError(f"{ref}: manifest {digest} ({media}) has no config or layers")
        check_declared(str(ref), config, layers)
        store.ensure()
        cache = BlobCache(store.root / "blobs")
        config_path = _fetch(cache, reg, config, progress)
        paths = []
        for layer in layers:
            kind = layer.get("mediaType") if isinstance(layer, dict) else None
            if kind not in LAYER_TYPES:
                raise RegistryError(f"{ref}: layer of unsupported type {kind!r}")
            if layer.get("urls"):
                raise RegistryError(f"{ref}: foreign layer {layer.get('digest')} (not in the registry)")
            paths.append(_fetch(cache, reg, layer, progress))
    image = parse_json(config_path.read_bytes(), f"{ref}: image config", RegistryError)
    if not isinstance(image, dict):
        raise RegistryError(f"{ref}: image config is not a JSON object")
    with store.create(name, source=str(ref), kind="pull") as staging:
        current = store.get(name)
        if current is not None and current.digest == digest:
            staging.abandon()  # another process pulled it while we downloaded
        else:
            say(f"{name}: unpacking {len(paths)} layers")
            staging.add_stats(unpack.extract_layers(paths, staging.tree))
            staging.config = ImageConfig.from_oci(image)
            staging.digest = digest
            staging.platform = platform_of(image) or wanted
    entry = store.get(name)
    assert entry is not None
    return entry


def check_declared(what: str, config: dict, layers: list) -> None:
    """Refuse, in one line, an image whose manifest declares more than the bounds allow, or a size that
    is not a count of bytes (a negative one would hide others from the total)."""
    if len(layers) > IMAGE_LAYERS_MAX:
        raise RegistryError(f"{what}: {len(layers)} layers, more than the {IMAGE_LAYERS_MAX} an image may have")
    size = config.get("size")
    if type(size) is not int or not 0 <= size <= IMAGE_JSON_MAX:
        raise RegistryError(f"{what}: image config without a size or larger than {IMAGE_JSON_MAX} bytes ({size!r})")
    total = size
    for layer in layers:
        size = layer.get("size") if isinstance(layer, dict) else None
        name = layer.get("digest") if isinstance(layer, dict) else None
        if type(size) is not int or size < 0:
            raise RegistryError(f"{what}: layer {name} declares no size in bytes ({str(size)[:40]!r})")
        if size > IMAGE_BLOB_MAX:
            raise RegistryError(
                f"{what}: layer {name} declares {size} bytes, more than {IMAGE_BLOB_MAX} ({IMAGE_BLOB_MAX >> 30} GiB)"
            )
        total += size
    if total > IMAGE_BLOBS_MAX:
        raise RegistryError(
            f"{what}: its blobs declare {total} bytes, more than {IMAGE_BLOBS_MAX} ({IMAGE_BLOBS_MAX >> 30} GiB) in all"
        )


def choose(index: dict, wanted: str, what: str) -> str:
    """The manifest digest for ``wanted`` (``os/arch[/variant]``) in an index."""
    entries = [m for m in index.get("manifests") or [] if isinstance(m, dict)]
    fits = [m for m in entries if matches(m.get("platform") or {}, wanted)]
    if not fits:
        have = sorted(
            {
                "/".join(filter(None, (p.get("os"), p.get("architecture"), p.get("variant"))))
                for p in (m.get("platform") or {} for m in entries)
            }
        )
        raise RegistryError(f"{what} has no image for {wanted} (it has: {', '.join(have) or 'none'}); use --platform")
    digest = fits[0].get("digest")
    if not isinstance(digest, str):
        raise RegistryError(f"{what}: index entry without a digest")
    return digest


def _fetch(cache: BlobCache, reg: Registry, descriptor: dict, progress: Progress | None) -> Path:
    digest, size = descriptor.get("digest"), descriptor.get("size")
    if not isinstance(digest, str) or not isinstance(size, int) or size < 0:
        raise RegistryError(f"descriptor without a digest or size: {json.dumps(descriptor)[:200]}")
    for attempt in range(ATTEMPTS):
        try:
            return cache.fetch(digest, size, lambda offset: reg.blob(digest, size, offset), progress)
        except DownloadInterrupted:
            if attempt + 1 == ATTEMPTS:
                raise
    raise AssertionError("unreachable")


def platform_of(image: dict) -> str | None:
    os_name, arch = image.get("os"), image.get("architecture")
    if isinstance(os_name, str) and isinstance(arch, str):
        variant = image.get("variant")
        return f"{os_name}/{arch}" + (f"/{variant}" if isinstance(variant, str) and variant else "")
    return None
