"""HTTPS for the console (ROS-free): a certificate the user gives, or a self-signed one made on first use.

A headset's browser grants WebXR only to a secure context: ``https://`` or ``http://localhost``. On any address
but loopback the console therefore serves HTTPS. Without a certificate of the lab's own (``tls.cert_file`` /
``tls.key_file``), :func:`self_signed` makes one on first use with the ``openssl`` command line (an EC P-256
key, the console's addresses and host name as subject alternative names) into a folder of its own and reuses it
afterwards; the browser warns about it once, and the operator compares its SHA-256 fingerprint
(:func:`fingerprint`, logged at start) with the one the browser shows before accepting it. Delete the folder's
two files to make a new one (e.g. after the robot PC's address changed).
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import shutil
import socket
import ssl
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from ..errors import ConfigurationError

CERT_NAME, KEY_NAME = "console-cert.pem", "console-key.pem"  # the files of a generated certificate
VALID_DAYS = 825  # [days] a generated certificate's validity (the longest some browsers accept)
OPENSSL_TIMEOUT_S = 30.0


class TlsFiles(NamedTuple):
    """The certificate the console serves."""

    cert: Path  # PEM certificate (chain)
    key: Path  # PEM private key
    fingerprint: str  # SHA-256 of the certificate (DER), as AA:BB:...
    generated: bool  # made by :func:`self_signed` just now


def fingerprint(cert: Path) -> str:
    """The SHA-256 fingerprint of a PEM certificate's first certificate, as browsers show it (``AA:BB:...``).

    Raises:
        ConfigurationError: the file cannot be read or holds no PEM certificate.
    """
    try:
        der = ssl.PEM_cert_to_DER_cert(Path(cert).read_text(encoding="ascii"))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"{cert}: not a readable PEM certificate ({exc})") from None
    digest = hashlib.sha256(der).hexdigest().upper()
    return ":".join(digest[i:i + 2] for i in range(0, len(digest), 2))


def server_names(host: str) -> list[str]:
    """The names a certificate of a console bound to ``host`` should carry: that address (every address of
    this machine for ``0.0.0.0`` / ``::``), its host name, ``localhost`` and the loopback addresses."""
    names: list[str] = []
    wildcard = host in ("0.0.0.0", "::")
    if not wildcard:
        names.append(host)
    hostname = socket.gethostname()
    if wildcard:
        try:
            names += [info[4][0] for info in socket.getaddrinfo(hostname, None)]
        except OSError:
            pass
        try:  # the address of the default route (no packet is sent)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect(("192.0.2.1", 9))
                names.append(s.getsockname()[0])
        except OSError:
            pass
    names += [hostname, "localhost", "127.0.0.1", "::1"]
    return list(dict.fromkeys(n.split("%")[0] for n in names if n))


def _subject_alt_names(names: Iterable[str]) -> str:
    entries = []
    for name in names:
        try:
            entries.append(f"IP:{ipaddress.ip_address(name)}")
        except ValueError:
            entries.append(f"DNS:{name}")
    return ",".join(dict.fromkeys(entries))


def self_signed(directory: str | Path, names: Iterable[str]) -> TlsFiles:
    """The self-signed certificate in ``directory`` (made with ``openssl`` when it holds none) for ``names``.

    Raises:
        ConfigurationError: ``openssl`` is missing or fails, or the folder cannot be written.
    """
    folder = Path(directory).expanduser()
    cert, key = folder / CERT_NAME, folder / KEY_NAME
    if cert.exists() and key.exists():
        return TlsFiles(cert, key, fingerprint(cert), False)
    openssl = shutil.which("openssl")
    if openssl is None:
        raise ConfigurationError("the console needs HTTPS off loopback and there is no certificate: install openssl "
                                 "(apt-get install openssl) or give tls.cert_file and tls.key_file")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o700)
    except OSError as exc:
        raise ConfigurationError(f"cannot create the certificate folder {folder}: {exc}") from None
    command = [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
               "-keyout", str(key), "-out", str(cert), "-days", str(VALID_DAYS), "-subj", "/CN=rynn-teleop console",
               "-addext", f"subjectAltName={_subject_alt_names(names)}",
               "-addext", "basicConstraints=critical,CA:FALSE", "-addext", "extendedKeyUsage=serverAuth"]
    old_umask = os.umask(0o077)  # the key is readable by its owner only
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=OPENSSL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigurationError(f"openssl failed to make the console's certificate: {exc}") from None
    finally:
        os.umask(old_umask)
    if done.returncode != 0 or not cert.exists() or not key.exists():
        for path in (cert, key):
            path.unlink(missing_ok=True)
        raise ConfigurationError(f"openssl failed to make the console's certificate ({' '.join(command[:3])} ...): "
                                 f"{done.stderr.strip()[-400:]}")
    return TlsFiles(cert, key, fingerprint(cert), True)


def given(cert_file: str | Path, key_file: str | Path) -> TlsFiles:
    """A certificate the user gives (both files).

    Raises:
        ConfigurationError: a file is missing or is not a PEM certificate.
    """
    cert, key = Path(cert_file).expanduser(), Path(key_file).expanduser()
    for what, path in (("tls.cert_file", cert), ("tls.key_file", key)):
        if not path.is_file():
            raise ConfigurationError(f"{what}: no such file {path}")
    return TlsFiles(cert, key, fingerprint(cert), False)


def server_context(files: TlsFiles) -> ssl.SSLContext:
    """A TLS server context (TLS 1.2 or newer) serving ``files``.

    Raises:
        ConfigurationError: the key does not match the certificate, or a file is not PEM.
    """
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(str(files.cert), str(files.key))
    except (ssl.SSLError, OSError) as exc:
        raise ConfigurationError(f"cannot serve HTTPS with {files.cert} and {files.key}: {exc}") from None
    return context
