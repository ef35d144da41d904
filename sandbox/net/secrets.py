"""Secrets that never enter the jail (``SandboxConfig.secrets``): each command sees a placeholder in
its environment, and the ``allow`` proxy puts the real value in its place only in the headers of
HTTPS requests to a host the secret is bound to. Runs in the host process: the user's thread makes
a ``Vault`` when a jail is built, the proxy's thread uses it.

The proxy terminates TLS for a bound host with a certificate from the sandbox's own CA, made here
when its first jail is built: the jail trusts its certificate (added to the root filesystem's
bundles, as ``ca_certs`` are), its key never leaves this process, and it is name-constrained to the
bound hosts, so it cannot vouch for any other name even if it leaked. Upstream, the proxy speaks
TLS to the real server, verified against the host's own trust store. A request to any other host,
plain HTTP included, travels with the placeholder unchanged; bodies are never rewritten.

Bounds: a secret's value at most ``MAX_VALUE`` bytes, printable, no line breaks (it goes into a
header); at most ``MAX_SECRETS`` secrets and ``MAX_HOSTS`` hosts each, so the leaf certificates
cached per vault are bounded too.
"""

from __future__ import annotations

import base64
import datetime
import os
import re
import secrets as random
from collections.abc import Iterable
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from ..errors import ConfigError
from .policy import normalize_host

if TYPE_CHECKING:  # ssl and cryptography load with the first vault: every SandboxConfig imports this module
    import ssl

MAX_SECRETS = 32
MAX_HOSTS = 16
MAX_VALUE = 8192
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
VALUE = re.compile(r"[\x20-\x7e]+")  # one header value's worth: no control characters, no line breaks
CA_DAYS = 30


class Secret(BaseModel):
    """A credential the jail never sees: ``Secret(name="GITHUB_TOKEN", value=..., hosts=["api.github.com"])``.
    Commands see ``$GITHUB_TOKEN`` as a placeholder; HTTPS requests to a bound host carry the value
    wherever a header held the placeholder."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="the environment variable commands see the placeholder in")
    value: SecretStr = Field(description="the credential; never printed, logged or written")
    hosts: tuple[str, ...] = Field(description="host names whose HTTPS requests get the value, e.g. api.github.com")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME.fullmatch(v):
            raise ValueError(f"{v!r} is not an environment variable name, e.g. GITHUB_TOKEN")
        return v

    @field_validator("value")
    @classmethod
    def _value(cls, v: SecretStr) -> SecretStr:
        text = v.get_secret_value()
        if len(text.encode()) > MAX_VALUE or not VALUE.fullmatch(text):
            raise ValueError(f"a secret's value is printable ASCII without line breaks, at most {MAX_VALUE} bytes")
        return v

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not 1 <= len(v) <= MAX_HOSTS:
            raise ValueError(f"a secret is bound to 1 to {MAX_HOSTS} host names, e.g. hosts=['api.github.com']")
        out = []
        for host in v:
            try:
                name = normalize_host(host)
            except ValueError:
                raise ValueError(f"{host!r} is not a host name, e.g. api.github.com") from None
            if name.startswith("*") or name.replace(".", "").isdigit() or ":" in name:
                raise ValueError(f"{host!r}: a secret is bound to exact host names, not patterns or addresses")
            out.append(name)
        return tuple(out)


def from_flag(text: str, environ: dict[str, str]) -> Secret:
    """``NAME@HOST[,HOST][:FILE]`` (``--secret``): the value from ``FILE`` (its one line), else from
    ``environ[NAME]``: never from the command line, where ``ps`` and shell history would show it."""
    name, at, rest = text.partition("@")
    if not at:
        raise ValueError(f"{text!r}: expected NAME@HOST[,HOST][:FILE], e.g. --secret GITHUB_TOKEN@api.github.com")
    hosts, colon, path = rest.partition(":")
    if colon:
        value = _read_value(path)
    elif name in environ:
        value = environ[name]
    else:
        raise ValueError(f"{text!r}: ${name} is not set here; export it, or name a file: NAME@HOST:FILE")
    return Secret(name=name, value=value, hosts=tuple(h for h in hosts.split(",") if h))


def _read_value(path: str) -> str:
    """A secret's file: a regular file, read bounded; one trailing line break dropped."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise ValueError(f"cannot read the secret's file {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"the secret's file {path} is not a regular file")
        data = f.read(MAX_VALUE + 2)
    text = data.decode("utf-8", errors="replace")
    return text[:-1] if text.endswith("\n") else text


def check_all(secrets: Iterable[Secret]) -> None:
    """Distinct names, within the count (a ValueError naming the field)."""
    names = [s.name for s in secrets]
    if len(names) > MAX_SECRETS:
        raise ValueError(f"at most {MAX_SECRETS} secrets")
    if len(set(names)) != len(names):
        raise ValueError("two secrets have the same name")


class Vault:
    """One sandbox's secrets on the host: the placeholders, the CA and its certificates."""

    def __init__(self, secrets: Iterable[Secret], label: str) -> None:
        import ssl

        try:
            from cryptography import x509
        except ImportError as exc:
            from ...extras import missing

            raise ConfigError(missing("secrets", exc)) from None
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self._secrets = tuple(secrets)
        self.placeholders = {s.name: f"jailbox-secret-{random.token_hex(20)}" for s in self._secrets}
        self.hosts = frozenset(h for s in self._secrets for h in s.hosts)
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"jailbox sandbox {label} secrets CA")])
        self._name = name
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
            )  # keyCertSign and cRLSign only
            .add_extension(
                x509.NameConstraints(
                    permitted_subtrees=[x509.DNSName(h) for h in sorted(self.hosts)], excluded_subtrees=None
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.ca_pem = self._cert.public_bytes(serialization.Encoding.PEM).decode()
        self._contexts: dict[str, ssl.SSLContext] = {}
        self.upstream = ssl.create_default_context()  # the real server, against the host's own trust store

    def env(self) -> dict[str, str]:
        return dict(self.placeholders)

    def binds(self, host: str) -> bool:
        return host in self.hosts

    def server_context(self, host: str) -> ssl.SSLContext:
        """What the proxy shows a jail that asked for ``host`` (one of ``hosts``): a certificate for
        that name only, HTTP/1.1 only (so each request's headers pass through here), and no other
        name asked for in the handshake."""
        import ssl

        ctx = self._contexts.get(host)
        if ctx is None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            ctx.set_alpn_protocols(["http/1.1"])
            _load_chain(ctx, *self._leaf(host))

            def sni(conn: ssl.SSLObject, name: str | None, _ctx: ssl.SSLContext) -> int | None:
                return None if name is None or normalize_host(name) == host else ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME

            ctx.sni_callback = sni
            self._contexts[host] = ctx
        return ctx

    def swap(self, host: str, headers: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], list[str]]:
        """``headers`` with the placeholder of each secret bound to ``host`` replaced by its value,
        also inside an ``Authorization: Basic`` pair (what clients make of ``https://user:$TOKEN@host``
        URLs: git, pip); and the names of the secrets put in."""
        used: list[str] = []

        def put(text: str) -> str:
            for secret in self._secrets:
                placeholder = self.placeholders[secret.name]
                if host in secret.hosts and placeholder in text:
                    text = text.replace(placeholder, secret.value.get_secret_value())
                    if secret.name not in used:
                        used.append(secret.name)
            return text

        out = []
        for name, value in headers:
            value = put(value)
            scheme, _, pair = value.partition(" ")
            if name.lower() == "authorization" and scheme.lower() == "basic":
                try:
                    decoded = base64.b64decode(pair.strip(), validate=True).decode("latin-1")
                except ValueError:  # not base64: left as sent, for the server to refuse
                    decoded = None
                if decoded is not None and put(decoded) != decoded:
                    value = f"{scheme} {base64.b64encode(put(decoded).encode('latin-1')).decode()}"
            out.append((name, value))
        return out, used

    def _leaf(self, host: str) -> tuple[bytes, bytes]:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return cert.public_bytes(serialization.Encoding.PEM), key_pem


def _load_chain(ctx: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """``load_cert_chain`` reads files only: these go through memfds, never a file on disk."""
    fds = []
    try:
        for data in (cert, key):
            fd = os.memfd_create("jailbox-leaf", os.MFD_CLOEXEC)
            fds.append(fd)
            os.write(fd, data)
        ctx.load_cert_chain(f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}")
    finally:
        for fd in fds:
            os.close(fd)
