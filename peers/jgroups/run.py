#!/usr/bin/env python3
"""Runs JGroups' total-order throughput beside Conclave's: three member JVMs on loopback (TCP +
SEQUENCER), 1 KiB messages, every member counting what it delivers. Prints one JSON line per
run: the slowest member's rate over the whole run and over its second half (once the JIT has
warmed up), and the JVMs' peak memory. With --rate, the senders pace their messages (taking
turns) and the line gives the delays from send to delivery, every member's pooled.

    python3 peers/jgroups/run.py --senders 3 --seconds 15 [--rounds 3]
    python3 peers/jgroups/run.py --senders 3 --rate 1000 --seconds 15

The first run fetches JGroups from Maven Central into peers/jgroups/target and checks its
SHA-256; `java` and `javac` come from PATH (or --java-home)."""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

VERSION = "5.5.7.Final"
SHA256 = "0280f032a37b1d3c9e2a7c8235a652888d6acb35d43b2fd7d8878c5e9d4b2493"
URL = f"https://repo1.maven.org/maven2/org/jgroups/jgroups/{VERSION}/jgroups-{VERSION}.jar"
HERE = Path(__file__).resolve().parent
TARGET = HERE / "target"


def fetch_jar() -> Path:
    jar = TARGET / f"jgroups-{VERSION}.jar"
    if not jar.exists():
        TARGET.mkdir(exist_ok=True)
        part = jar.with_suffix(".part")
        try:
            with urllib.request.urlopen(URL, timeout=60) as r, open(part, "wb") as f:
                f.write(r.read())
        except OSError as e:
            part.unlink(missing_ok=True)
            sys.exit(f"fetching {URL}: {e}")
        part.rename(jar)
    digest = hashlib.sha256(jar.read_bytes()).hexdigest()
    if digest != SHA256:
        jar.unlink()
        sys.exit(f"{jar.name}: SHA-256 {digest}, expected {SHA256}; removed it")
    return jar


def tool(java_home: str | None, name: str) -> str:
    return str(Path(java_home) / "bin" / name) if java_home else name


def compile_member(jar: Path, java_home: str | None) -> Path:
    classes = TARGET / "classes"
    source = HERE / "Throughput.java"
    built = classes / "Throughput.class"
    if not built.exists() or built.stat().st_mtime < source.stat().st_mtime:
        classes.mkdir(parents=True, exist_ok=True)
        javac = tool(java_home, "javac")
        try:
            subprocess.run(
                [javac, "--release", "17", "-d", str(classes), "-cp", str(jar), str(source)],
                check=True,
            )
        except (OSError, subprocess.CalledProcessError) as e:
            sys.exit(f"compiling the member with {javac}: {e}")
    return classes


def percentile(sorted_values: list, p: float) -> int:
    """The same rule as `conclave bench latency`'s: the value at the rounded rank."""
    return sorted_values[round((len(sorted_values) - 1) * p)]


def one_run(args, jar: Path, classes: Path) -> dict:
    # Each member writes to files, not pipes: a pipe read only after another member has ended
    # could fill and stall a JVM (its delays, or JGroups' own warnings) and with it the group.
    logs = tempfile.TemporaryDirectory(prefix="conclave-jgroups-")
    try:
        return members_run(args, jar, classes, Path(logs.name))
    finally:
        logs.cleanup()


def members_run(args, jar: Path, classes: Path, logs: Path) -> dict:
    hosts = ",".join(f"127.0.0.1[{args.port + i}]" for i in range(args.members))
    procs = []

    def fail(why: str):
        # The others would wait for the missing member for ever.
        for q in procs:
            q.kill()
        sys.exit(why)

    for i in range(args.members):
        cmd = [
            tool(args.java_home, "java"),
            "-Djava.net.preferIPv4Stack=true",
            f"-Dtcp-nodelay={'true' if args.nodelay else 'false'}",
            f"-Djgroups.tcp.bind_port={args.port + i}",
            f"-Djgroups.tcpping.initial_hosts={hosts}",
            "-cp",
            f"{jar}{os.pathsep}{classes}",
            "Throughput",
            "--config",
            str(HERE / "jgroups-sequencer.xml"),
            "--name",
            f"m{i}",
            "--members",
            str(args.members),
            "--senders",
            str(args.senders),
            "--size",
            str(args.size),
            "--seconds",
            str(args.seconds),
        ]
        # Every member reads the stamps; the senders take turns.
        if args.rate:
            cmd += ["--rate", str(args.rate)]
        # The first member is the coordinator, so the sequencer: with one sender, it sends
        # (JGroups' best case, its messages need no forwarding).
        if i < args.senders:
            cmd.append("--send")
            if args.rate:
                cmd += ["--phase", str(i / args.senders)]
        with open(logs / f"m{i}.out", "w") as out, open(logs / f"m{i}.err", "w") as err:
            try:
                procs.append(subprocess.Popen(cmd, stdout=out, stderr=err))
            except OSError as e:
                fail(f"starting member m{i} with {cmd[0]}: {e}")
        if i == 0:
            time.sleep(2)
    rows = []
    deadline = time.monotonic() + args.seconds + 120

    for i, p in enumerate(procs):
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            fail(f"member m{i} did not finish in time")
        out = (logs / f"m{i}.out").read_text()
        err = (logs / f"m{i}.err").read_text()
        line = next((l for l in out.splitlines() if l.startswith("{")), None)
        if p.returncode != 0 or line is None:
            fail(f"member m{i} failed ({p.returncode}): {err.strip()[-2000:]}")
        rows.append(json.loads(line))
    sent = sum(r["sent"] for r in rows)
    row = {
        "peer": "jgroups",
        "version": VERSION,
        "stack": "tcp+sequencer" + (", nodelay" if args.nodelay else ""),
        "members": args.members,
        "senders": args.senders,
        "size": args.size,
        "seconds": args.seconds,
        "sent": sent,
        "all_delivered": all(r["delivered"] == sent for r in rows),
        "msgs_per_s_min": min(r["msgs_per_s"] for r in rows),
        "second_half_msgs_per_s_min": min(r["second_half_msgs_per_s"] for r in rows),
        "rss_peak_mib_total": round(sum(r["rss_peak_mib"] for r in rows), 1),
    }
    if args.rate:
        delays = sorted(d for r in rows for d in r["delays_us"])
        row["rate"] = args.rate
        row["deliveries"] = len(delays)
        if delays:
            row["p50_us"] = percentile(delays, 0.5)
            row["p99_us"] = percentile(delays, 0.99)
            row["max_us"] = delays[-1]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--senders", type=int, default=3)
    ap.add_argument("--members", type=int, default=3)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--rate", type=float, default=0, help="messages a second over all senders")
    ap.add_argument(
        "--nodelay",
        action="store_true",
        help="TCP_NODELAY on JGroups' connections (its tcp.xml leaves Nagle's algorithm on)",
    )
    ap.add_argument("--port", type=int, default=7800)
    ap.add_argument("--java-home", help="a JDK other than the one on PATH")
    args = ap.parse_args()
    if not 1 <= args.senders <= args.members:
        sys.exit("--senders must be between 1 and --members")
    if args.rate < 0:
        sys.exit("--rate must not be negative")
    if args.size < 9:
        sys.exit("--size must be at least 9 bytes")
    jar = fetch_jar()
    classes = compile_member(jar, args.java_home)
    for _ in range(args.rounds):
        print(json.dumps(one_run(args, jar, classes)), flush=True)


if __name__ == "__main__":
    main()
