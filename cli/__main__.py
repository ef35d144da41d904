"""``python -m jailbox.cli``: the ``jailbox`` command."""

from . import main

main()
