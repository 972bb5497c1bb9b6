"""Certificates and keys for a throwaway local control plane.

Owns: one CA, the API server's serving certificate, client certificates (one identity
per component), and the service-account signing key pair, written as PEM files.
Everything is ECDSA P-256 because generating it is fast; nothing here is meant to
protect anything beyond a loopback test cluster.
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=30)


@attrs.frozen
class CertPair:
    cert: Path
    key: Path


@attrs.frozen
class Authority:
    """The CA: signs every certificate of one cluster."""

    pair: CertPair
    _cert: x509.Certificate
    _key: ec.EllipticCurvePrivateKey

    def issue(
        self,
        directory: Path,
        name: str,
        *,
        common_name: str,
        organizations: tuple[str, ...] = (),
        server_names: tuple[str, ...] = (),
        server_ips: tuple[str, ...] = (),
    ) -> CertPair:
        """A leaf certificate: a server one when names or IPs are given, else a client one."""
        key = ec.generate_private_key(ec.SECP256R1())
        subject = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
        subject.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        is_server = bool(server_names or server_ips)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if is_server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            _base_builder(x509.Name(subject), self._cert.subject, key)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if is_server:
            alternatives: list[x509.GeneralName] = [x509.DNSName(n) for n in server_names]
            alternatives += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in server_ips]
            builder = builder.add_extension(
                x509.SubjectAlternativeName(alternatives), critical=False
            )
        cert = builder.sign(self._key, hashes.SHA256())
        return _write_pair(directory, name, cert, key)


def create_authority(directory: Path, *, common_name: str) -> Authority:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        _base_builder(name, name, key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return Authority(_write_pair(directory, "ca", cert, key), cert, key)


def create_signing_key(directory: Path, name: str) -> CertPair:
    """A service-account token signing pair: `.cert` holds the public key (not a cert)."""
    key = ec.generate_private_key(ec.SECP256R1())
    public = directory / f"{name}.pub"
    private = directory / f"{name}.key"
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    _write_private(private, key)
    return CertPair(cert=public, key=private)


def _base_builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
) -> x509.CertificateBuilder:
    # Backdated a little so a process whose clock reads slightly earlier still accepts it.
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
    )


def _write_pair(
    directory: Path, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> CertPair:
    cert_path = directory / f"{name}.crt"
    key_path = directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_private(key_path, key)
    return CertPair(cert=cert_path, key=key_path)


def _write_private(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.touch(mode=0o600)
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
