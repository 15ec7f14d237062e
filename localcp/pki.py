"""Certificates for the local control plane and the webhook, made with the openssl CLI."""
from __future__ import annotations

import subprocess
from pathlib import Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca(directory: Path, name: str = "ca") -> tuple[Path, Path]:
    key, crt = directory / f"{name}.key", directory / f"{name}.crt"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key.name, "-out", crt.name,
             "-days", "2", "-subj", f"/CN=gpu-scheduler-local-{name}", cwd=directory)
    return key, crt


def make_cert(directory: Path, name: str, ca: tuple[Path, Path], subject: str,
              sans: tuple[str, ...] = (), client: bool = False) -> tuple[Path, Path]:
    """A key and a certificate signed by `ca`; serving certificates get `sans`."""
    key, csr, crt, ext = (directory / f"{name}.{suffix}" for suffix in ("key", "csr", "crt", "ext"))
    usage = "clientAuth" if client else "serverAuth"
    lines = ["basicConstraints=CA:FALSE", "keyUsage=digitalSignature,keyEncipherment", f"extendedKeyUsage={usage}"]
    if sans:
        lines.append("subjectAltName=" + ",".join(sans))
    ext.write_text("\n".join(lines) + "\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key.name, "-out", csr.name, "-subj", subject,
             cwd=directory)
    _openssl("x509", "-req", "-in", csr.name, "-CA", str(ca[1]), "-CAkey", str(ca[0]), "-CAcreateserial",
             "-out", crt.name, "-days", "2", "-extfile", ext.name, cwd=directory)
    return key, crt


def make_rsa_key(path: Path) -> Path:
    _openssl("genrsa", "-out", path.name, "2048", cwd=path.parent)
    return path
