"""Root filesystem recipes (``*.yaml``), installed as the package ``jailbox.sandbox.rootfs.recipes``."""
