"""What the processes of services that tests start (Redis, PostgreSQL, InfluxDB, Kafka) have in
common."""
import shutil
import signal
import subprocess


class ServiceProcess:
    """A service a test runs in a directory of its own, ``self.dir``: a ``with`` block stops it,
    ``remove()`` also deletes the directory. One that runs a single process keeps it in
    ``self.proc``, is shown by ``where()``, and stops on ``stop_signal`` (SIGKILL after
    ``stop_timeout`` seconds); others define ``stop()`` and ``kill()``."""

    dir: str
    proc = None
    stop_signal = signal.SIGTERM
    stop_timeout = 30.0

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

    def stop(self, timeout=None):
        """``stop_signal`` and waits; ``kill()`` after ``timeout`` (default ``stop_timeout``) s."""
        if self.running():
            self.proc.send_signal(self.stop_signal)
            try:
                self.proc.wait(self.stop_timeout if timeout is None else timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self):
        """SIGKILL: the service gets no chance to write anything more."""
        if self.running():
            self.proc.kill()
            self.proc.wait()

    def remove(self):
        """Stops the service and deletes its directory."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
