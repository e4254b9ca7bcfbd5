"""Client-side TLS and credentials: what a ``Client`` needs to reach a secured cluster.

The secret is resolved when a connection is made, from (in order) ``secret``,
``secret_file`` (first line) or the environment variable ``secret_env``, so a caller can
pass only where the secret lives (e.g. in a Spark query plan) and never the secret itself.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class ClientSecurity:
    # TLS: on when ca_file is set; the node's certificate is verified against it.
    ca_file: str | None = None
    # Mutual TLS: the certificate and key this client presents.
    cert_file: str | None = None
    key_file: str | None = None
    # Authentication (SCRAM-SHA-256): on when principal is set.
    principal: str | None = None
    secret: str | None = field(default=None, repr=False)
    secret_file: str | None = None
    secret_env: str | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("a client certificate needs both cert_file and key_file")
        if self.cert_file is not None and self.ca_file is None:
            raise ValueError("a client certificate needs TLS: give ca_file too")
        if self.principal is not None and not (self.secret or self.secret_file or self.secret_env):
            raise ValueError(
                f"principal {self.principal!r} needs a secret: secret_file, secret_env or secret"
            )

    @property
    def tls(self) -> bool:
        return self.ca_file is not None

    def ssl_context(self) -> ssl.SSLContext | None:
        if self.ca_file is None:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca_file)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cert_file is not None and self.key_file is not None:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx

    def credentials(self) -> tuple[str, str] | None:
        if self.principal is None:
            return None
        if self.secret:
            return self.principal, self.secret
        if self.secret_file:
            try:
                lines = Path(self.secret_file).read_text().splitlines()
            except OSError as exc:
                raise ValueError(f"cannot read secret file {self.secret_file}: {exc}") from exc
            if not lines or not lines[0]:
                raise ValueError(f"secret file {self.secret_file} is empty")
            return self.principal, lines[0]
        assert self.secret_env is not None
        value = os.environ.get(self.secret_env)
        if not value:
            raise ValueError(
                f"environment variable {self.secret_env} (the secret of principal "
                f"{self.principal!r}) is not set in this process"
            )
        return self.principal, value
