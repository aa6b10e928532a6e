"""simweb over HTTPS: a throwaway test CA made at start, and server certificates for every host.

The CA and its key live only in a temporary directory for the life of the server (the CA
certificate is written to ``ca_file`` so a crawler can trust it: crawlerd's ``fetch.ca_file``).
Hosts are grouped ``HOSTS_PER_CERT`` to a certificate (each lists its hosts as DNS subjectAltNames,
RFC 5280 §4.2.1.6; a wildcard ``*.sim`` would not do: verifiers refuse wildcards one label above a
TLD) and the server picks the certificate by SNI (RFC 6066 §3), as a virtual-hosting server does.
One P-256 key serves every leaf certificate: key generation would dominate start-up at 20,000 hosts.

Requires the ``cryptography`` package (an extra of the test and bench installs).
"""

from __future__ import annotations

import datetime
import os
import ssl
import tempfile

HOSTS_PER_CERT = 64


class TestCA:
    """A CA and its server contexts. Key: certificate group ``index // HOSTS_PER_CERT``.

    Invariant: ``contexts[g]`` serves a certificate whose SANs are exactly the names of group ``g``.
    """

    def __init__(self, names_by_index: list[str], workdir: str | None = None) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self._dir = tempfile.TemporaryDirectory(prefix="simweb-tls-", dir=workdir)
        d = self._dir.name
        now = datetime.datetime.now(datetime.UTC)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "simweb throwaway test CA")])
        ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
              .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=7))
              .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
              .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                           content_commitment=False, key_encipherment=False,
                                           data_encipherment=False, key_agreement=False,
                                           encipher_only=False, decipher_only=False), critical=True)
              .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
              .sign(ca_key, hashes.SHA256()))
        self.ca_file = os.path.join(d, "ca.pem")
        with open(self.ca_file, "wb") as f:
            f.write(ca.public_bytes(serialization.Encoding.PEM))
        leaf_key = ec.generate_private_key(ec.SECP256R1())
        key_file = os.path.join(d, "leaf-key.pem")
        with open(key_file, "wb") as f:
            f.write(leaf_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
        aki = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())
        self._group_of: dict[str, int] = {}
        self.contexts: list[ssl.SSLContext] = []
        for g in range(0, max(1, len(names_by_index)), HOSTS_PER_CERT):
            names = names_by_index[g:g + HOSTS_PER_CERT] or ["localhost"]
            cert = (x509.CertificateBuilder()
                    .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
                    .issuer_name(ca_name).public_key(leaf_key.public_key())
                    .serial_number(x509.random_serial_number())
                    .not_valid_before(now - datetime.timedelta(days=1))
                    .not_valid_after(now + datetime.timedelta(days=7))
                    .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
                    .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                    .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                                   critical=False)
                    .add_extension(aki, critical=False)
                    .sign(ca_key, hashes.SHA256()))
            cert_file = os.path.join(d, f"leaf-{g // HOSTS_PER_CERT}.pem")
            with open(cert_file, "wb") as f:
                f.write(cert.public_bytes(serialization.Encoding.PEM))
            self.contexts.append(self._context(cert_file, key_file))
            for n in names:
                self._group_of[n] = len(self.contexts) - 1

    @staticmethod
    def _context(cert_file: str, key_file: str) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(cert_file, key_file)
        ctx.set_alpn_protocols(["http/1.1"])
        return ctx

    def server_context(self) -> ssl.SSLContext:
        """The listening context: its SNI callback switches each connection to its host's certificate."""
        ctx = self.contexts[0]
        group_of, contexts = self._group_of, self.contexts

        def pick(sslobj: ssl.SSLObject, server_name: str | None, _ctx: ssl.SSLContext) -> None:
            g = group_of.get((server_name or "").lower().rstrip("."))
            if g is not None and g:
                sslobj.context = contexts[g]
            return None

        ctx.sni_callback = pick
        return ctx

    def close(self) -> None:
        self._dir.cleanup()
