"""Root filesystems for jails: pulled OCI images, imported archives, built trees, in one store.

Modules, one concern each: ``store`` (named entries, atomic creation, locking), ``unpack`` and
``untar`` (safe extraction inside the jail's id map, run by ``worker``), ``reference`` (image
references), ``registry`` (the OCI distribution API), ``blobs`` (the content-addressed download
cache), ``image`` (image config, platforms), ``pull`` and ``importer`` (the two ways in besides a
build), ``resolve`` (what a ``SandboxConfig.rootfs`` name means), ``users`` (which ids a
``SandboxConfig.user`` or an image's User means). Stdlib-only modules (``untar``,
``worker``) are imported by the worker's ``python -I -S``: keep this file free of imports.
"""
