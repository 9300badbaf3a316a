"""What the processes of services that tests start (Redis, Kafka) have in common."""
import shutil


class ServiceProcess:
    """A service a test runs in a directory of its own, ``self.dir``: a ``with`` block stops it,
    ``remove()`` also deletes the directory. Subclasses define ``stop()``; one that runs a single
    process keeps it in ``self.proc`` and is shown by ``where()``."""

    dir: str
    proc = None

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def where(self):
        """Where it listens, for ``repr``."""
        return f"{self.host}:{self.port}"

    def __repr__(self):
        state = "running" if self.running() else "stopped"
        return f"<{type(self).__name__} {self.where()} {state} dir={self.dir}>"

    def stop(self):
        raise NotImplementedError

    def remove(self):
        """Stops the service and deletes its directory."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
