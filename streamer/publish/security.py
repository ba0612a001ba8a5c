"""Who may bind where, and CURVE keys.

The stream carries patient-derived data, so it stays on loopback unless the
operator either sets up CURVE (a server key pair plus an allow-list of client
public keys, checked by a ZAP authenticator) or says `insecure_bind` outright.
Key files use the ZeroMQ certificate format (`NAME.key` public,
`NAME.key_secret` both halves), so czmq and pyzmq tools read them too.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from streamer.errors import ConfigError, InputError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KeyPair:
    """z85-encoded CURVE keys; `secret` is None for someone else's public key."""

    public: bytes
    secret: bytes | None = None


@dataclass(frozen=True)
class CurveServer:
    """What a publisher needs to require CURVE: its key pair and whom to let in."""

    keys: KeyPair
    allowed_clients: frozenset[bytes]


@dataclass(frozen=True)
class CurveClient:
    """What a subscriber needs to reach a CURVE publisher."""

    keys: KeyPair
    server_public: bytes


def default_key_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "streamer" / "keys"


def generate_keypair(directory: Path, name: str) -> tuple[Path, Path]:
    """Write NAME.key and NAME.key_secret (mode 0600); never overwrite a key."""
    directory.mkdir(parents=True, exist_ok=True)
    public, secret = directory / f"{name}.key", directory / f"{name}.key_secret"
    for path in (public, secret):
        if path.exists():
            raise ConfigError(f"{path} already exists; remove it first to replace the key")
    zmq.auth.create_certificates(directory, name)
    secret.chmod(0o600)
    return public, secret


def load_keys(path: Path) -> KeyPair:
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise InputError(path, f"not a CURVE key file: {exc}") from exc
    return KeyPair(public, secret)


def load_secret_keys(path: Path) -> KeyPair:
    keys = load_keys(path)
    if keys.secret is None:
        raise InputError(path, "holds no secret key (use the .key_secret file)")
    return keys


def load_public_keys(paths: Iterable[Path]) -> frozenset[bytes]:
    """Public keys from key files, or from every *.key file in a directory."""
    found = set()
    for path in paths:
        files = sorted(path.glob("*.key")) if path.is_dir() else [path]
        found.update(load_keys(f).public for f in files)
    return frozenset(found)


def is_loopback(endpoint: str) -> bool:
    """True when nothing off this machine can reach the endpoint."""
    transport, _, address = endpoint.partition("://")
    if transport in ("ipc", "inproc"):
        return True
    if transport != "tcp":
        return False
    host = address.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # '*', an interface name or a host name
        return False


def check_binds(endpoints: Iterable[str], curve: CurveServer | None, insecure_bind: bool) -> None:
    """Refuse, before binding anything, what would expose the stream unauthenticated."""
    if curve is not None:
        if curve.keys.secret is None:
            raise ConfigError("CURVE server keys have no secret key")
        if not curve.allowed_clients:
            raise ConfigError("CURVE is on but the client allow-list is empty: no subscriber could connect")
        return
    exposed = [e for e in endpoints if not is_loopback(e)]
    if exposed and not insecure_bind:
        raise ConfigError(
            f"refusing to bind {', '.join(exposed)}: not a loopback address. Publishing beyond this machine "
            "needs CURVE (a server key pair and an allow-list of client public keys, made with "
            "`streamer keys generate`), or --insecure-bind to publish unauthenticated"
        )
    if exposed:
        log.warning("publishing unauthenticated and unencrypted on %s (insecure bind)", ", ".join(exposed))


class _AllowList:
    """ZAP credentials provider: the authenticator calls `callback` with a z85 key."""

    def __init__(self, allowed: frozenset[bytes]):
        self._allowed = allowed
        self._refused: set[bytes] = set()  # warn once per key: refused peers reconnect every 100 ms

    def callback(self, domain: str, key: bytes) -> bool:
        allowed = key in self._allowed
        if not allowed and key not in self._refused:
            self._refused.add(key)
            log.warning("refused a subscriber with an unknown CURVE key %s", key.decode("ascii", "replace"))
        return allowed


def start_authenticator(context: zmq.Context, curve: CurveServer) -> ThreadAuthenticator:
    """Start the context's ZAP handler; it must run before any CURVE socket binds."""
    auth = ThreadAuthenticator(context, log=log.getChild("zap"))
    auth.start()
    auth.configure_curve_callback(domain="*", credentials_provider=_AllowList(curve.allowed_clients))
    return auth


def make_server(socket: zmq.Socket, curve: CurveServer) -> None:
    socket.curve_secretkey = curve.keys.secret
    socket.curve_publickey = curve.keys.public
    socket.curve_server = True


def make_client(socket: zmq.Socket, curve: CurveClient) -> None:
    if curve.keys.secret is None:
        raise ConfigError("CURVE client keys have no secret key")
    socket.curve_secretkey = curve.keys.secret
    socket.curve_publickey = curve.keys.public
    socket.curve_serverkey = curve.server_public
