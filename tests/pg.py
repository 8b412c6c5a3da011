"""A throwaway PostgreSQL server for the test session: ``initdb`` and ``pg_ctl`` in a temp dir.

PostgreSQL refuses to run as root, so under root the server runs as the ``postgres`` user
(Debian's package creates it); otherwise as the current user. It listens on 127.0.0.1 on a free
port, with a password (scram-sha-256) so the URL the router gets is the kind an operator writes.
Durability settings are relaxed (``fsync=off``): the server lives for one test session.

Each test gets its own schema (:meth:`PostgresServer.fresh_url`) instead of its own database:
creating a schema takes a millisecond.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

from router.proc import free_port

MISSING = ("PostgreSQL was not found: these tests start a throwaway PostgreSQL 15 server with initdb and pg_ctl. "
           "Install Debian's postgresql package (apt-get install postgresql), or set ROUTER_TEST_PG_BIN to the "
           "folder holding initdb and pg_ctl.")


def find_bin() -> Path:
    candidates = [os.environ.get("ROUTER_TEST_PG_BIN", "")]
    on_path = shutil.which("initdb")
    candidates.append(str(Path(on_path).parent) if on_path else "")
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    for folder in candidates:
        if folder and (Path(folder) / "initdb").exists() and (Path(folder) / "pg_ctl").exists():
            return Path(folder)
    raise RuntimeError(MISSING)


class PostgresServer:
    def __init__(self) -> None:
        self.bin = find_bin()
        self.root = Path(tempfile.mkdtemp(prefix="router-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.password = secrets.token_urlsafe(16)
        self.user = "router"
        self.database = "router"
        self._as: list[str] = []
        if os.geteuid() == 0:
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError:
                raise RuntimeError("running as root and there is no 'postgres' user to run the throwaway "
                                   "PostgreSQL server as (PostgreSQL refuses root)") from None
            os.chown(self.root, owner.pw_uid, owner.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        self.url = (f"postgresql://{self.user}:{self.password}@127.0.0.1:{self.port}/{self.database}")

    def _run(self, *command: str, timeout: float = 60) -> None:
        done = subprocess.run([*self._as, *command], capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")

    def start(self) -> "PostgresServer":
        pwfile = self.root / "pw"
        pwfile.write_text(self.password)
        if self._as:
            owner = pwd.getpwnam("postgres")
            os.chown(pwfile, owner.pw_uid, owner.pw_gid)
        os.chmod(pwfile, 0o600)
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", self.user, f"--pwfile={pwfile}",
                  "--auth=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync")
        options = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                   "-c synchronous_commit=off -c full_page_writes=off -c max_connections=300 "
                   "-c shared_buffers=64MB")
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "log"), "-o", options,
                  "-w", "-t", "60", "start", timeout=90)
        import psycopg

        with psycopg.connect(self.url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as connection:
            connection.execute(f"CREATE DATABASE {self.database}")
        return self

    def fresh_url(self, schema: str | None = None) -> str:
        """The server's URL with a new, empty schema first on the search path."""
        import psycopg

        schema = schema or f"t_{secrets.token_hex(6)}"
        with psycopg.connect(self.url, autocommit=True) as connection:
            connection.execute(f'CREATE SCHEMA "{schema}"')
        return f"{self.url}?options=-csearch_path%3D{schema}"

    def stop(self) -> None:
        try:
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop", timeout=60)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
