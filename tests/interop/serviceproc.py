"""What the processes of services that tests start (Redis, Kafka) have in common."""
import shutil


class ServiceProcess:
    """A service a test runs in a directory of its own, ``self.dir``: a ``with`` block stops it,
    ``remove()`` also deletes the directory. Subclasses define ``stop()``."""

    dir: str

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
