"""The lab cluster's certificates and keys, as a real cluster's installer makes them: one CA, the
API server's serving certificate, client certificates per component (the identity in CN, the
groups in O), and the service-account signing key pair; and, as kubeadm, a second CA of its own
for the front proxy, which signs the client certificate the API server presents to aggregated API
servers (an extension API server trusts that CA for request headers, not the cluster's).

Plain data in (names, addresses), PEM files out; ``cryptography`` does the work."""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=365)
CLUSTER_CA = "ferry-lab-ca"


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(cn: str, orgs: Sequence[str] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    return x509.Name([*attrs, x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(path: str, data: bytes, private: bool = False) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class Authority:
    """A CA kept in ``directory`` (``ca.crt``/``ca.key``), named ``name`` (its subject's CN);
    issues certificates into it."""

    def __init__(self, directory: str, name: str = CLUSTER_CA) -> None:
        self.directory = directory
        os.makedirs(directory, exist_ok=True)
        crt, key = self.path("ca.crt"), self.path("ca.key")
        if os.path.exists(crt) and os.path.exists(key):
            with open(key, "rb") as f:
                loaded = serialization.load_pem_private_key(f.read(), None)
            assert isinstance(loaded, ec.EllipticCurvePrivateKey)
            self.key = loaded
            with open(crt, "rb") as f:
                self.cert = x509.load_pem_x509_certificate(f.read())
            return
        self.key = _key()
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (x509.CertificateBuilder().subject_name(_name(name))
                     .issuer_name(_name(name)).public_key(self.key.public_key())
                     .serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + VALIDITY)
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                  content_commitment=False, key_encipherment=False,
                                                  data_encipherment=False, key_agreement=False,
                                                  encipher_only=False, decipher_only=False), critical=True)
                     .sign(self.key, hashes.SHA256()))
        _write(key, _key_pem(self.key), private=True)
        _write(crt, self.cert.public_bytes(serialization.Encoding.PEM))

    def path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def issue(self, stem: str, cn: str, orgs: Sequence[str] = (), server_names: Sequence[str] = (),
              client: bool = True) -> tuple[str, str]:
        """``<stem>.crt`` and ``<stem>.key``: a client certificate, also a serving one when
        ``server_names`` (DNS names and IP addresses) are given. Returns both paths."""
        key = _key()
        now = datetime.datetime.now(datetime.UTC)
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
        builder = (x509.CertificateBuilder().subject_name(_name(cn, orgs)).issuer_name(self.cert.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + VALIDITY)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True))
        if server_names:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
            alt: list[x509.GeneralName] = []
            for n in server_names:
                try:
                    alt.append(x509.IPAddress(ipaddress.ip_address(n)))
                except ValueError:
                    alt.append(x509.DNSName(n))
            builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        crt_path, key_path = self.path(f"{stem}.crt"), self.path(f"{stem}.key")
        _write(key_path, _key_pem(key), private=True)
        _write(crt_path, cert.public_bytes(serialization.Encoding.PEM))
        return crt_path, key_path

    def service_account_keys(self) -> tuple[str, str]:
        """``sa.key`` (the controller-manager signs tokens) and ``sa.pub`` (the API server checks)."""
        priv, pub = self.path("sa.key"), self.path("sa.pub")
        if not (os.path.exists(priv) and os.path.exists(pub)):
            key = _key()
            _write(priv, _key_pem(key), private=True)
            _write(pub, key.public_key().public_bytes(serialization.Encoding.PEM,
                                                      serialization.PublicFormat.SubjectPublicKeyInfo))
        return priv, pub
