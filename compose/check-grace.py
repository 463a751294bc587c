#!/usr/bin/env python3
"""Static check: every Weir service's stop_grace_period exceeds the shutdown deadline
it is given (DEP-1..3), in each compose file and in each combination the docs use.

Usage: check-grace.py FILE [FILE ...]  (checks the files as merged by docker-compose)
"""
import re
import subprocess
import sys

import yaml

WEIR_BINARIES = {"metad", "streamd", "gatewayd"}
DEFAULT_DEADLINE = 50  # --shutdown-deadline-sec
DEFAULT_GRACE = 10     # Docker's default stop timeout


def seconds(value):
    """A compose duration ("1m30s", "60s", 60) in seconds."""
    if value is None:
        return DEFAULT_GRACE
    if isinstance(value, (int, float)):
        return float(value)
    total = 0.0
    for amount, unit in re.findall(r"([\d.]+)(ms|us|h|m|s)", str(value)):
        total += float(amount) * {"h": 3600, "m": 60, "s": 1, "ms": 0.001, "us": 1e-6}[unit]
    return total


def deadline(service):
    command = service.get("command") or []
    if isinstance(command, str):
        command = command.split()
    for i, arg in enumerate(command):
        if arg == "--shutdown-deadline-sec" and i + 1 < len(command):
            return float(command[i + 1])
        if arg.startswith("--shutdown-deadline-sec="):
            return float(arg.split("=", 1)[1])
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(e.split("=", 1) for e in env if "=" in e)
    return float(env.get("WEIR_SHUTDOWN_DEADLINE_SEC", DEFAULT_DEADLINE))


def main(files):
    args = ["docker-compose"] + [a for f in files for a in ("-f", f)] + ["config"]
    merged = yaml.safe_load(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
    failures = []
    for name, service in merged["services"].items():
        command = service.get("command") or service.get("entrypoint") or []
        binary = (command.split() if isinstance(command, str) else command or [""])[0]
        if binary not in WEIR_BINARIES:
            continue
        grace, limit = seconds(service.get("stop_grace_period")), deadline(service)
        if grace <= limit:
            failures.append(f"{name}: stop_grace_period {grace:g}s does not exceed --shutdown-deadline-sec {limit:g}")
        else:
            print(f"ok {name}: grace {grace:g}s > deadline {limit:g}s")
    if failures:
        print("\n".join(failures), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
