"""Root filesystem recipes (``*.yaml``), installed as the package ``sandbox.rootfs.recipes``."""
