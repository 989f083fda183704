"""Test helpers for DDS Security permissions documents: a permissions CA, signing, tampering.

Keys are EC P-256 (fast). Signing uses the ``openssl`` command line tool exactly as an operator
does (``docs/dds-permissions.md``), so the tests check what real DDS tooling produces:
``openssl smime -sign -text -signer CA.pem -inkey CA.key``.
"""

from __future__ import annotations

import datetime
import re
import subprocess
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

__all__ = ["issue_signer", "make_ca", "sign_permissions", "tamper"]


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower() or "ca"


def _write(directory: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
           ) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    cert_path = directory / f"{stem}.pem"
    key_path = directory / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    key_path.chmod(0o600)
    return cert_path, key_path


def _validity(builder: x509.CertificateBuilder, days: float) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (builder.not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days)))


def make_ca(tmp_path: Path, name: str = "DDS Permissions CA", *, days: float = 1.0
            ) -> tuple[Path, Path]:
    """Create a self-signed permissions CA (EC P-256, CA:TRUE, keyCertSign + digitalSignature).

    Args:
        tmp_path: directory for the files (created if missing).
        name: the CA's CN; also names the files (``dds-permissions-ca.pem``/``.key``), so
            several CAs can share a directory.
        days: validity from five minutes ago.

    Returns:
        ``(certificate PEM path, private key PEM path)``.
    """
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number()))
    cert = (_validity(builder, days)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return _write(tmp_path, _slug(name), cert, key)


def issue_signer(tmp_path: Path, ca_cert: Path, ca_key: Path, name: str = "DDS Signer"
                 ) -> tuple[Path, Path]:
    """Create an end-entity signing certificate issued by the CA (to sign on its behalf).

    Returns:
        ``(certificate PEM path, private key PEM path)`` named after ``name``.
    """
    issuer = x509.load_pem_x509_certificate(ca_cert.read_bytes())
    issuer_key = serialization.load_pem_private_key(ca_key.read_bytes(), None)
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
               .issuer_name(issuer.subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number()))
    cert = (_validity(builder, 1.0)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(issuer_key, hashes.SHA256()))  # type: ignore[arg-type]
    return _write(tmp_path, _slug(name), cert, key)


def sign_permissions(xml_text: str, ca_cert: Path, ca_key: Path, out_path: Path) -> Path:
    """Sign a permissions document as DDS tools do: ``openssl smime -sign -text``.

    Args:
        xml_text: the permissions XML.
        ca_cert: the signer's certificate (the permissions CA, or one it issued).
        ca_key: the signer's private key.
        out_path: where to write the S/MIME signed document (``.p7s``).

    Returns:
        ``out_path``.

    Raises:
        subprocess.CalledProcessError: openssl failed (its stderr is in the exception).
    """
    subprocess.run(
        ["openssl", "smime", "-sign", "-text", "-signer", str(ca_cert), "-inkey", str(ca_key),
         "-out", str(out_path)],
        input=xml_text.encode(), capture_output=True, check=True, timeout=30)
    return out_path


def tamper(path: Path) -> Path:
    """Change one byte of the signed content of an S/MIME document, in place.

    The first letter of the first grant's name has its case swapped (``<grant name="alice"``
    becomes ``name="Alice"``), so the XML stays well-formed and only the signature can tell;
    without a grant the ``d`` of ``<dds`` is changed instead.

    Returns:
        ``path``.
    """
    data = bytearray(path.read_bytes())
    marker = data.find(b'<grant name="')
    if marker >= 0:
        at = marker + len(b'<grant name="')
        data[at] = ord(chr(data[at]).swapcase()) if chr(data[at]).isalpha() else ord("x")
    else:
        at = data.index(b"<dds") + 1
        data[at] = ord("D")
    path.write_bytes(bytes(data))
    return path
