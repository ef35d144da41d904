"""Extra CA certificates (``SandboxConfig.ca_certs``, ``--ca-cert``): a jail behind a TLS-intercepting proxy.

A stand-in HTTPS server on the host's loopback, with a CA made here, is reached from inside (host
networking) by curl, Python's urllib and pip: refused without the option, trusted with it; the
tree is never written, the environment never changes, and a hostile tree's links lead nowhere.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import own_for_jails, snapshot
from pydantic import ValidationError
from support.bundle_tree import CERTIFI, HOST_BUNDLE, USR, bundle_tree, tree_config
from support.cli import JAILBOX
from support.paper_tree import paper_store
from support.renames import renaming
from support.standin import StandIn, make_ca

from jailbox.sandbox import Mount, Sandbox, SandboxConfig

PIP_CERTIFI = "usr/local/lib/python3.11/site-packages/pip/_vendor/certifi/cacert.pem"


@pytest.fixture
def pki(tmp_path: Path) -> tuple[Path, Path, Path]:
    return make_ca(tmp_path / "pki", ["127.0.0.1"])


@pytest.fixture
def server(pki: tuple[Path, Path, Path]):
    standin = StandIn(cert=(pki[1], pki[2]))
    yield standin
    standin.close()


def _fetch(server: StandIn) -> str:
    """curl, urllib with the system defaults, urllib with certifi's bundle: one exit code each."""
    url = f"https://127.0.0.1:{server.port}/hello"
    certifi = "/" + CERTIFI
    return (
        f"curl -sS -m 10 -o /dev/null {url}; echo curl=$?; "
        f"python3 -c \"import urllib.request; urllib.request.urlopen('{url}', timeout=10)\" 2>/dev/null; "
        "echo urllib=$?; "
        f"python3 -c \"import ssl, urllib.request; urllib.request.urlopen('{url}', timeout=10, "
        f"context=ssl.create_default_context(cafile='{certifi}'))\" 2>/dev/null; echo certifi=$?"
    )


@pytest.mark.needs("openssl", "curl")
def test_a_named_ca_is_trusted_by_curl_python_and_certifi_and_nothing_else_changes(tmp_path, pki, server):
    root = bundle_tree(tmp_path)
    before = snapshot(root)
    with Sandbox(tree_config(root)) as sb:
        refused = sb.exec(_fetch(server))
        env = sb.exec("env | sort").stdout
    assert refused.stdout == "curl=60\nurllib=1\ncertifi=1\n", refused.stderr
    with Sandbox(tree_config(root, ca_certs=[pki[0]])) as sb:
        trusted = sb.exec(_fetch(server))
        assert sb.exec("env | sort").stdout == env  # no SSL_CERT_FILE or the like: the model sees the same
        # the tree's certificates are all still there, the test CA once at the end
        count = sb.exec("grep -c 'BEGIN CERTIFICATE' /etc/ssl/certs/ca-certificates.crt").stdout
    assert trusted.stdout == "curl=0\nurllib=0\ncertifi=0\n", trusted.stderr
    assert int(count) == HOST_BUNDLE.read_text().count("BEGIN CERTIFICATE") + 1
    assert snapshot(root) == before  # written in the writable layer, never in the tree


@pytest.mark.needs("openssl")
def test_a_tree_without_a_final_newline_and_with_two_paths_to_one_bundle_gets_each_certificate_once(tmp_path, pki):
    root = bundle_tree(tmp_path, links={"etc/ssl/cert.pem": "certs/ca-certificates.crt"})
    bundle = root / "etc/ssl/certs/ca-certificates.crt"
    bundle.write_bytes(bundle.read_bytes().rstrip(b"\n"))
    with Sandbox(tree_config(root, ca_certs=[pki[0], pki[0]])) as sb:
        r = sb.exec("tail -c 2000 /etc/ssl/certs/ca-certificates.crt; grep -c 'BEGIN CERTIFICATE' /etc/ssl/cert.pem")
    ca = pki[0].read_text()
    assert r.stdout.count(ca) == 2  # the two files named, in order
    assert f"-----END CERTIFICATE-----\n{ca}" in r.stdout  # the tree's last one kept its end line
    assert int(r.stdout.splitlines()[-1]) == HOST_BUNDLE.read_text().count("BEGIN CERTIFICATE") + 2


@pytest.mark.needs("openssl")
@pytest.mark.parametrize(
    "links",
    [
        # each bundle a link to a host file, absolute and climbing out: resolved in the tree, where it is not
        {"etc/ssl/certs/ca-certificates.crt": "{outside}/secret", CERTIFI: "../../../../../../../..{outside}/secret"},
        # to where a read-write bind of that host directory will be: binds are mounted after the bundles
        {"etc/ssl/certs/ca-certificates.crt": "/data/secret", CERTIFI: "/data/secret"},
        # the python directory a link to the host directory, and the system bundle a link to a device
        {"usr/local/lib/python3.11": "{outside}", "etc/ssl/certs/ca-certificates.crt": "/dev/null"},
    ],
    ids=["host-path", "bind-to-be", "dir-and-device"],
)
def test_a_hostile_tree_cannot_point_the_bundles_outside_itself(tmp_path, pki, outside, links):
    links = {rel: target.format(outside=outside) for rel, target in links.items()}
    root = bundle_tree(tmp_path, links)
    (outside / "python3.11" / "site-packages" / "certifi").mkdir(parents=True)
    (outside / "python3.11" / "site-packages" / "certifi" / "cacert.pem").write_text("host bundle\n")
    host = snapshot(outside)
    with Sandbox(
        tree_config(root, ca_certs=[pki[0]], mounts=[Mount(outside, "/data", readonly=False, give=True)])
    ) as sb:
        assert sb.exec("true").exit_code == 0
        assert sb.exec("cat /data/secret").stdout == "host secret\n"
    assert snapshot(outside) == host


@pytest.mark.needs("openssl")
def test_a_neighbours_renames_do_not_fail_a_setup_through_links_that_climb(tmp_path, pki):
    """The bundles are opened held in the tree; a link of thirty ``..`` (ten more than it has) made
    most single tries fail (EAGAIN) beside a jail renaming in a loop: each start still finds them."""
    root = bundle_tree(tmp_path, links={CERTIFI: "../" * 30 + "etc/ssl/certs/ca-certificates.crt"})
    with Sandbox() as renamer:
        renaming(renamer)
        for _ in range(5):
            with Sandbox(tree_config(root, ca_certs=[pki[0]])) as sb:
                count = sb.exec(f"grep -c 'BEGIN CERTIFICATE' /{CERTIFI}").stdout
                assert int(count) == HOST_BUNDLE.read_text().count("BEGIN CERTIFICATE") + 1


@pytest.mark.needs("openssl")
def test_a_fifo_bundle_is_passed_over_not_waited_on(tmp_path, pki):
    root = bundle_tree(tmp_path)
    (root / CERTIFI).unlink()
    os.mkfifo(root / CERTIFI)
    if os.getuid() == 0:
        own_for_jails(root)
    with Sandbox(tree_config(root, ca_certs=[pki[0]], setup_timeout=20)) as sb:
        assert sb.exec("grep -c 'jailbox test CA' /etc/ssl/certs/ca-certificates.crt || true").exit_code == 0


@pytest.mark.needs("openssl")
def test_bad_certificate_files_are_refused_naming_the_field(tmp_path, pki):
    (tmp_path / "text.pem").write_text("not a certificate\n")
    (tmp_path / "big.pem").write_bytes(pki[0].read_bytes() + b"#" * (1 << 20))
    broken = pki[0].read_text().replace("\n", "\nAAAA", 2)
    (tmp_path / "broken.pem").write_text(broken)
    os.mkfifo(tmp_path / "fifo.pem")
    root = bundle_tree(tmp_path)
    cases = {
        tmp_path / "missing.pem": "cannot read",
        tmp_path: "cannot read|not a regular file",
        tmp_path / "text.pem": "no PEM certificate",
        tmp_path / "big.pem": "larger than",
        tmp_path / "broken.pem": "OpenSSL refused",
        tmp_path / "fifo.pem": "not a regular file",
    }
    for path, message in cases.items():
        with pytest.raises(ValidationError, match=rf"ca_certs[\s\S]*({message})"):
            SandboxConfig(rootfs=str(root), ca_certs=[path])
    with pytest.raises(ValidationError, match=r"ca_certs[\s\S]*host rootfs"):
        SandboxConfig(ca_certs=[pki[0]])


@pytest.mark.needs("openssl", "curl")
def test_the_ca_cert_flag_feeds_the_field_and_a_bad_one_is_named(tmp_path, pki, server):
    root = bundle_tree(tmp_path)
    usr = [f"--bind=/usr/{d}:/usr/{d}" for d in USR if Path(f"/usr/{d}").is_dir()]
    cli = [*JAILBOX, "exec", "--rootfs", str(root), "--network", "host", *usr]
    url = f"https://127.0.0.1:{server.port}/hello"
    ok = subprocess.run([*cli, "--ca-cert", str(pki[0]), "--", "curl", "-sS", url], capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout.startswith("hello from"), ok.stderr
    (tmp_path / "key.pem").write_text("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    bad = subprocess.run([*cli, "--ca-cert", str(tmp_path / "key.pem"), "true"], capture_output=True, text=True)
    assert bad.returncode == 2
    line = bad.stderr.strip()
    assert "\n" not in line and line.startswith("jailbox: --ca-cert: ") and "e.g. --ca-cert " in line, line


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.paper_tree
@pytest.mark.needs("openssl")
def test_pip_curl_and_git_of_the_paper_tree_trust_the_named_ca(monkeypatch, tmp_path, pki, server):
    """The default recipe's pip uses its vendored certifi: both it and the system bundle learn the CA."""
    monkeypatch.setenv("JAILBOX_CACHE_DIR", str(paper_store()))
    tree = paper_store() / "rootfs" / "default" / "tree"
    stored = {rel: (tree / rel).read_bytes() for rel in ("etc/ssl/certs/ca-certificates.crt", PIP_CERTIFI)}
    # by name: pip 25's truststore refuses an https URL with an IP address whatever it trusts
    origin = f"https://pypi.test:{server.port}"
    index = f"{origin}/simple"
    commands = (
        "echo 127.0.0.1 pypi.test >> /etc/hosts; "
        f"curl -sS -o /dev/null {index}/jbdemo/; echo curl=$?; "
        f"git ls-remote {origin}/static/none.git >/dev/null 2>&1; echo git=$?; "
        f"pip download -q --no-deps --retries 0 --index-url {index} -d /tmp/d jbdemo >/dev/null 2>&1; echo pip=$?"
    )
    with Sandbox(SandboxConfig(rootfs="default", network="host")) as sb:
        refused = sb.exec(commands)
    # git reaches the server once it trusts it, and is answered 404 (no such repository): exit 128 either way,
    # so its verdict is read from what it says
    assert refused.stdout == "curl=60\ngit=128\npip=1\n", refused.stderr
    with Sandbox(SandboxConfig(rootfs="default", network="host", ca_certs=[pki[0]])) as sb:
        trusted = sb.exec(commands)
        git = sb.exec(f"git ls-remote {origin}/static/none.git")
        assert sb.exec("ls /tmp/d").stdout == "jbdemo-1.0-py3-none-any.whl\n"
    assert trusted.stdout == "curl=0\ngit=128\npip=0\n", trusted.stderr
    assert "SSL certificate problem" not in git.stderr and "not found" in git.stderr, git.stderr
    assert {rel: (tree / rel).read_bytes() for rel in stored} == stored
