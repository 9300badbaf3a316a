"""Throwaway certificates for the TLS tests, made with the openssl command at test time.

``Pki(directory)``: ``ca(name)`` makes a CA (``<name>.pem`` / ``<name>.key``), ``issue(file, cn,
ca=..., sans=...)`` a certificate it signs (``<file>.pem`` / ``<file>.key``, EC P-256, usable as
server and client certificate). Nothing is kept after the test.
"""
import os
import subprocess


def _openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=30)


class Pki:
    def __init__(self, directory):
        self.dir = str(directory)

    def path(self, name):
        return os.path.join(self.dir, name)

    def ca(self, name):
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", self.path(f"{name}.key"), "-out", self.path(f"{name}.pem"), "-days", "2",
                 "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        return self.path(f"{name}.pem")

    def issue(self, file, cn, ca, sans=("DNS:localhost", "IP:127.0.0.1")):
        """A certificate for ``cn`` (subject CN; omitted when None) signed by CA ``ca``."""
        ext = self.path(f"{file}.ext")
        with open(ext, "w") as f:
            if sans:
                f.write("subjectAltName=" + ",".join(sans) + "\n")
            f.write("extendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n")
        subject = f"/CN={cn}" if cn else "/O=braid tests"
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", self.path(f"{file}.key"), "-out", self.path(f"{file}.csr"), "-subj", subject)
        _openssl("x509", "-req", "-in", self.path(f"{file}.csr"), "-CA", self.path(f"{ca}.pem"),
                 "-CAkey", self.path(f"{ca}.key"), "-CAcreateserial", "-out", self.path(f"{file}.pem"),
                 "-days", "2", "-extfile", ext)
        return self.path(f"{file}.pem"), self.path(f"{file}.key")
