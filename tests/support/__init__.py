"""Helpers the tests share (they run in the test process unless a module says otherwise); no tests here.

- ``batch_tasks``: arithmetic tasks, a scripted model that solves them, and a ``jailbox bench`` launch line.
- ``browser``: Debian's headless Chromium driven by selenium, with a fresh profile, and a PNG screenshot's pixels.
- ``bound_probe``: a program that meets each bound a jail is given and reports what it got.
- ``cli``: ``JAILBOX``, the one command line that starts the ``jailbox`` CLI.
- ``host_memory``: the host's available memory, a fixture that checks a test leaves most of it, a sampler.
- ``js_sdk.cjs`` (not Python): scenarios Node runs with npm's E2B SDKs against ``jailbox serve``.
- ``llm_server``: a scripted OpenAI-compatible HTTP server on loopback.
- ``oci_images``: OCI layers and layouts built by hand, a local registry and a counting proxy.
- ``paper_tree``: the default recipe's tree, built once (early, in the background) and kept between runs.
- ``per_uid_fills``: what the kernel counts per host uid, filled from a jail.
- ``qemu_guest``: a throwaway QEMU guest with a cgroup v2 hierarchy, to run a script in.
- ``sdk_methods``: the public methods of the E2B SDKs an interpreter imports, as ``docs/e2b-compat.md`` names them.
- ``service_probe``: who listens on a service socket, and when that process has ended.
- ``standin``: a stand-in internet for the network tests: a test CA, HTTP(S) servers, a package index.
- ``waits``: ``wait_until``, the one way a test waits for what another process does.
- ``wheels``: jailbox built as a wheel and installed into a venv of its own.

``tests/`` is on ``sys.path`` (pytest puts ``conftest.py``'s directory there), so tests import these as
``support.NAME``.
"""
