"""What the bench scripts (compare, c1m, soak) share: free loopback ports, the open-file limit,
a process's figures from /proc and building the Braid they measure. Each script puts bench/ on
sys.path and imports this."""
import os
import resource
import socket
import subprocess
import sys

CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_braid(root):
    """Builds target/release/braid of the checkout at `root`, so that a run measures the code it
    sits in, not whatever binary an earlier build left."""
    print("building target/release/braid (cargo build --release -p braid)", file=sys.stderr, flush=True)
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "braid"], cwd=root, check=True)


def raise_nofile():
    """Raises this process's soft open-file limit to its hard limit (at most 2^20); returns it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard if hard != resource.RLIM_INFINITY else 1 << 20, 1 << 20)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def proc_user_sys_s(pid):
    """User and system CPU seconds of a process, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state); utime and stime are fields 14 and 15.
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def proc_cpu_s(pid):
    """CPU seconds (user + system) of a process."""
    return sum(proc_user_sys_s(pid))


def proc_status_kib(pid, key):
    """A kB field of /proc/PID/status (VmRSS, VmHWM, ...); 0 when absent."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0
