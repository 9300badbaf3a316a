#!/usr/bin/env python3
"""Idle-connection footprint: open N MQTT 3.1.1 connections to Braid and to Mosquitto (same run,
same loopback, same client code), keep them idle, and report each broker's RSS and connect rate.

Usage: bench/idle_connections.py [--connections 10000] [--braid target/release/braid]
"""
import argparse
import asyncio
import os
import resource
import socket
import struct
import subprocess
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, 1 << 20)
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def connect_packet(client_id):
    cid = client_id.encode()
    var = b"\x00\x04MQTT\x04\x02\x00\x3c"  # 3.1.1, clean session, keep alive 60
    payload = struct.pack("!H", len(cid)) + cid
    body = var + payload
    return b"\x10" + bytes([len(body)]) + body


async def open_one(port, i, keep):
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(connect_packet(f"idle-{i}"))
    await w.drain()
    ack = await r.readexactly(4)
    assert ack[0] == 0x20 and ack[3] == 0, ack
    keep.append(w)


async def run_clients(port, n, parallel=200):
    keep = []
    sem = asyncio.Semaphore(parallel)

    async def guarded(i):
        async with sem:
            await open_one(port, i, keep)

    t0 = time.perf_counter()
    await asyncio.gather(*(guarded(i) for i in range(n)))
    return keep, time.perf_counter() - t0


def start(cmd, port):
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=raise_nofile)
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{cmd[0]} did not start")


def measure(name, cmd, port, n, settle):
    proc = start(cmd, port)
    time.sleep(0.3)
    base = rss_kib(proc.pid)
    keep, secs = asyncio.run(hold(port, n, proc, settle))
    rss = keep
    proc.terminate()
    proc.wait(5)
    return {"broker": name, "base_kib": base, "rss_kib": rss, "secs": secs}


async def hold(port, n, proc, settle):
    keep, secs = await run_clients(port, n)
    await asyncio.sleep(settle)
    rss = rss_kib(proc.pid)
    for w in keep:
        w.close()
    return rss, secs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--connections", type=int, default=10000)
    ap.add_argument("--braid", default=os.path.join(ROOT, "target", "release", "braid"))
    ap.add_argument("--settle", type=float, default=8.0,
                    help="seconds the connections stay idle before RSS is read (Braid parks idle "
                         "connections after listeners.park_after_secs, default 5)")
    args = ap.parse_args()
    raise_nofile()
    n = args.connections
    results = []
    port = free_port()
    conf = tempfile.NamedTemporaryFile("w", suffix=".conf", delete=False)
    conf.write(f"listener {port} 127.0.0.1\nallow_anonymous true\n")
    conf.close()
    results.append(measure("mosquitto", ["mosquitto", "-c", conf.name], port, n, args.settle))
    port = free_port()
    # The QUIC and admin listeners on free ports, not the defaults another broker may hold.
    braid = [args.braid, "serve", "--listen", f"127.0.0.1:{port}",
             "--set", 'listeners.quic="127.0.0.1:0"', "--set", 'listeners.http="127.0.0.1:0"']
    results.append(measure("braid", braid, port, n, args.settle))
    print(f"RSS read after the connections were idle for {args.settle:g} s.")
    print(f"| broker | idle connections | RSS before | RSS with connections | per connection | connects/s |")
    print(f"| --- | --- | --- | --- | --- | --- |")
    for r in results:
        per = (r["rss_kib"] - r["base_kib"]) * 1024 / n
        print(f"| {r['broker']} | {n} | {r['base_kib']/1024:.1f} MiB | {r['rss_kib']/1024:.1f} MiB | {per:.0f} B | {n / r['secs']:.0f} |")


if __name__ == "__main__":
    main()
