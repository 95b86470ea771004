#!/usr/bin/env python3
"""The layer rules of docs/architecture.md, checked on what the compiler actually includes.

For every source file of the build (compile_commands.json), the compiler lists the headers it
includes (-M); a rule fails when a file of a layer reaches a header it must not:

  protocol cores (the coordinator and its parts, protocol/, the edge's relay, the agent's
  session): no Boost.Asio, no OpenSSL, nothing of transport/
  crypto/, robust/ and privacy/: nothing of ours but their own folder (and two header-only files
  of common/ that include nothing of ours: eigen.h, the include wrapper of Eigen, and result.h,
  the one result type)
  the roles meet only on the wire: nothing under server/, edge_aggregator/ or silo_agent/
  includes a header of another of them (tools/ and tests/ may)

and, on the cores' own code, that no core reads a clock or draws randomness itself: the wall
clock and random bytes reach them through crypto/sources.h, time through their calls' now.

Usage: layering_check.py BUILD_DIR SOURCE_DIR
"""

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

CORE = ["server/round_config.cpp", "server/selection.cpp", "server/membership.cpp", "server/metrics.cpp", "server/round_record.cpp",
        "server/aggregator.cpp", "server/commit.cpp", "server/upload_stage.cpp", "server/secure_groups.cpp", "server/secure_round.cpp", "server/coordinator.cpp",
        "server/optimizer.cpp", "server/coordinator_membership.cpp", "server/coordinator_uploads.cpp", "server/coordinator_broadcast.cpp", "server/coordinator_fetch.cpp", "server/coordinator_admin.cpp",
        "server/coordinator_timers.cpp", "server/coordinator_privacy.cpp",
        "edge_aggregator/relay.cpp", "silo_agent/session.cpp", "silo_agent/secure_client.cpp", "silo_agent/model_receipt.cpp", "silo_agent/masking_job.cpp", "silo_agent/training_job.cpp",
        "silo_agent/upload_source.cpp", "silo_agent/update.cpp"]
CORE_FORBIDDEN = ["boost/asio", "/openssl/", "/transport/"]
ROLES = ["server/", "edge_aggregator/", "silo_agent/"]
# A clock or a random source in a core's own code (comments included: say it another way).
CORE_WORLD = ["system_clock", "steady_clock", "high_resolution_clock", "random_device", "randombytes",
              "Secret::random", "RAND_bytes", "std::time(", "gettimeofday", "clock_gettime"]
# The only headers of ours that crypto/, robust/ and privacy/ may include: header-only, including nothing of ours.
BASE_SHARED = ["common/eigen.h", "common/result.h"]
OURS = ["proto/", "common/", "crypto/", "robust/", "privacy/", "protocol/", "transport/", "server/", "silo_agent/",
        "edge_aggregator/", "tools/"]


def headers(entry, build):
    args = shlex.split(entry["command"])
    # Drop the output and the object-file flags; ask for the dependency list instead.
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        if a in ("-c", "-MD", "-MMD"):
            continue
        out.append(a)
    deps = subprocess.run(out + ["-M", "-MG"], cwd=entry["directory"], capture_output=True, text=True, check=True)
    return deps.stdout.replace("\\\n", " ").split()[1:]


def each_source(entries):
    """A unity batch's entry (XSILO_UNITY) stands for the sources it includes: each is checked on its
    own, with the batch's command."""
    for e in entries:
        if not re.search(r"/Unity/unity_\d+_cxx\.cxx$", e["file"]):
            yield e
            continue
        for src in re.findall(r'^#include "([^"]+\.cpp)"', Path(e["file"]).read_text(), re.M):
            yield dict(e, file=src, command=e["command"].replace(e["file"], src))


def main():
    build, source = Path(sys.argv[1]), Path(sys.argv[2]).resolve()
    entries = list(each_source(json.loads((build / "compile_commands.json").read_text())))
    by_file = {str(Path(e["file"]).resolve().relative_to(source)): e for e in entries
               if Path(e["file"]).resolve().is_relative_to(source)}
    failures, checked = [], 0
    for rel, entry in sorted(by_file.items()):
        core = rel in CORE or rel.startswith(("protocol/", "server/secure/", "silo_agent/secure/"))
        base = rel.startswith(("crypto/", "robust/", "privacy/"))
        role = next((r for r in ROLES if rel.startswith(r) and rel.endswith(".cpp")), None)
        if not (core or base or role):
            continue
        checked += core or base
        if core:
            text = (source / rel).read_text()
            for bad in CORE_WORLD:
                if bad in text:
                    failures.append(f"{rel}: a protocol core uses {bad} (take it from crypto::Sources or the call's now)")
        for h in headers(entry, build):
            p = str(Path(h).resolve()) if not h.startswith("/") else h
            if core:
                for bad in CORE_FORBIDDEN:
                    if bad in p:
                        failures.append(f"{rel}: protocol core includes {h}")
                        break
            if role and p.startswith(str(source) + "/"):
                mine = p[len(str(source)) + 1:]
                other = next((r for r in ROLES if mine.startswith(r) and r != role), None)
                if other:
                    failures.append(f"{rel}: {role} meets {other} only on the wire, but includes {mine}")
            if base and p.startswith(str(source) + "/"):
                mine = p[len(str(source)) + 1:]
                folder = rel.split("/")[0] + "/"
                if mine.startswith(folder) or mine in BASE_SHARED:
                    continue
                if any(mine.startswith(o) for o in OURS):
                    failures.append(f"{rel}: {folder} depends on nothing of ours, but includes {mine}")
    if checked < len(CORE):
        failures.append(f"only {checked} of the layered sources are in compile_commands.json")
    for f in sorted(set(failures)):
        print(f)
    print(f"layering: {checked} sources checked, {len(set(failures))} violations")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
