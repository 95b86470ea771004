#!/usr/bin/env bash
# Builds the Debian package, installs it on this machine and runs a federation the way an
# operator would: the installed binary, the units' command lines and state folders, configs
# copied from the installed examples, kits in /etc/xsilo/kits, the daemons as the user xsilo.
# Then a corrupt and a foreign config must fail with exit code 2 and the file and key named.
# Finally it purges the package and deletes everything the package and the test made, also on
# failure. Needs root, and a machine without xsilo installed (it would delete that one's state).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

[ "$(id -u)" -eq 0 ] || { echo "package-test: run as root: it installs and purges the xsilo package" >&2; exit 1; }
if dpkg-query -W xsilo >/dev/null 2>&1 || getent passwd xsilo >/dev/null || getent group xsilo >/dev/null ||
  [ -e /etc/xsilo ] || [ -e /var/lib/xsilo ] || [ -e /var/log/xsilo ]; then
  echo "package-test: xsilo (the package, its user or its folders) is already on this machine, and this test" \
    "deletes all of it at the end: run it where xsilo is not installed" >&2
  exit 1
fi

say() { echo "package-test: $*"; }
fail() { echo "package-test: FAILED: $*" >&2; exit 1; }

work=$(mktemp -d /tmp/xsilo-package-test.XXXXXX)
pids=()
cleanup() {
  local rc=$?
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ "$rc" -ne 0 ]; then
    for f in "$work"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -n 15 "$f" >&2; }; done
  fi
  if dpkg-query -W xsilo >/dev/null 2>&1; then dpkg --purge xsilo >"$work/purge.log" 2>&1 || cat "$work/purge.log" >&2; fi
  rm -rf /etc/xsilo /var/lib/xsilo /var/log/xsilo
  if getent passwd xsilo >/dev/null; then userdel xsilo; fi
  if getent group xsilo >/dev/null; then groupdel xsilo; fi
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- build -----------------------------------------------------------------------------------
t0=$(date +%s)
deb=$(bash scripts/package.sh | tail -n 1)
t_build=$(($(date +%s) - t0))
t0=$(date +%s)
[ -f "$deb" ] || fail "scripts/package.sh printed no package ($deb)"
case $(basename "$deb") in xsilo_*_amd64.deb) ;; *) fail "unexpected file name $(basename "$deb")" ;; esac
depends=$(dpkg-deb -f "$deb" Depends)
say "built $(basename "$deb") in ${t_build}s; Depends: $depends"
for lib in libssl3 libsodium23 libprotobuf32 adduser; do
  grep -q "$lib" <<<"$depends" || fail "Depends lacks $lib"
done
if command -v lintian >/dev/null; then  # for the record; its remarks do not fail the test
  say "lintian: $( (lintian "$deb" 2>&1 || true) | grep -v 'root privileges' | tr '\n' ';' || true)"
fi

# --- install ---------------------------------------------------------------------------------
DEBIAN_FRONTEND=noninteractive dpkg -i "$deb" >"$work/dpkg-install.log" 2>&1 ||
  { cat "$work/dpkg-install.log" >&2; fail "dpkg -i"; }
listed=$(dpkg -L xsilo)
for f in /usr/bin/xsilo /etc/xsilo/server.json /etc/xsilo/edge.json /etc/xsilo/agent.json \
  /lib/systemd/system/xsilo-server.service /lib/systemd/system/xsilo-edge.service \
  /lib/systemd/system/xsilo-agent@.service /usr/share/doc/xsilo/README.md \
  /usr/share/doc/xsilo/copyright /usr/share/doc/xsilo/docs/operations.md; do
  grep -qxF "$f" <<<"$listed" || fail "dpkg -L xsilo does not list $f"
  [ -e "$f" ] || fail "$f is listed but not installed"
done
conffiles=$(dpkg-query -W -f='${Conffiles}\n' xsilo)
for f in server edge agent; do
  grep -q "/etc/xsilo/$f.json" <<<"$conffiles" || fail "/etc/xsilo/$f.json is not a conffile"
done
version=$(/usr/bin/xsilo --version)
grep -q "x86-64-v2" <<<"$version" || fail "the installed binary is not the portable build: $version"
[ "$(getent passwd xsilo | cut -d: -f6,7)" = /var/lib/xsilo:/usr/sbin/nologin ] || fail "user xsilo: $(getent passwd xsilo)"
expect_stat() {  # PATH OWNER:GROUP MODE
  local got
  got=$(stat -c '%U:%G %a' "$1")
  [ "$got" = "$2 $3" ] || fail "$1 is $got, expected $2 $3"
}
expect_stat /etc/xsilo root:xsilo 750
expect_stat /etc/xsilo/kits root:xsilo 750
expect_stat /var/lib/xsilo xsilo:xsilo 750
expect_stat /var/log/xsilo xsilo:xsilo 750
say "installed: $(wc -l <<<"$listed") paths, 3 conffiles, user xsilo, folders and modes as expected"
say "installed binary: $version"

# --- the units -------------------------------------------------------------------------------
# The template is checked through an instance, which systemd loads from the template beside it.
units=(/lib/systemd/system/{xsilo-server.service,xsilo-edge.service,xsilo-agent@hospital-a.service})
if command -v systemd-analyze >/dev/null; then
  if ! systemd-analyze verify "${units[@]}" >"$work/verify.log" 2>&1; then
    cat "$work/verify.log" >&2
    fail "systemd-analyze verify"
  fi
  if [ -s "$work/verify.log" ]; then
    echo "systemd-analyze verify said:"
    sed 's/^/  /' "$work/verify.log"
  fi
  say "systemd-analyze verify: ${units[*]##*/} OK"
  for u in "${units[@]}"; do  # for the record: what the sandbox leaves open
    systemd-analyze security --offline=true "$u" 2>/dev/null | tail -n 1 | sed 's/^/  /' || true
  done
else
  say "systemd-analyze not available: units not verified"
fi
for u in xsilo-server.service xsilo-edge.service xsilo-agent@.service; do
  for key in User=xsilo ProtectSystem=strict Restart=on-failure RestartPreventExitStatus=2 NoNewPrivileges=yes; do
    grep -qxF "$key" "/lib/systemd/system/$u" || fail "$u lacks $key"
  done
done

# A unit's line KEY=, for the instance INSTANCE (%i), as systemd would see it.
unit_value() {  # UNIT KEY INSTANCE
  local v
  v=$(sed -n "s/^$2=//p" "/lib/systemd/system/$1")
  echo "${v//%i/${3-}}"
}
# Starts a unit's ExecStart as systemd would: as User=, a clean environment, UMask=, no new
# privileges, its StateDirectory made first. The sandbox itself (ProtectSystem...) needs systemd
# as PID 1, which this test does not assume.
start_unit() {  # UNIT INSTANCE LOG
  local user state cmd
  user=$(unit_value "$1" User "$2")
  state=$(unit_value "$1" StateDirectory "$2")
  install -d -o "$user" -g "$user" -m 0750 "/var/lib/$state"
  read -r -a cmd <<<"$(unit_value "$1" ExecStart "$2")"
  (umask 0027 && exec env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/var/lib/xsilo \
    timeout 240 setpriv --reuid="$user" --regid="$user" --init-groups --no-new-privs -- "${cmd[@]}") \
    >"$3" 2>&1 &
  pids+=($!)
}
config_value() {  # FILE KEY
  /usr/bin/python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"
}

# --- the operator: a CA and kits where the installed configs point ---------------------------
(
  cd "$work"
  /usr/bin/xsilo pki init --out pki --federation oncology-2026
  /usr/bin/xsilo pki issue --pki pki --role server --name server
  /usr/bin/xsilo pki issue --pki pki --role silo --name hospital-a
  /usr/bin/xsilo pki issue --pki pki --role silo --name hospital-b
) >"$work/pki.log" 2>&1 || fail "xsilo pki"
for name in server hospital-a hospital-b; do
  cp -r "$work/pki/kits/$name" "/etc/xsilo/kits/$name"
  chown -R xsilo:xsilo "/etc/xsilo/kits/$name"
done

# Each hospital's data, readable by the daemons but not theirs to change: half the rows each.
install -d -o root -g xsilo -m 0750 /var/lib/xsilo/data
for name in hospital-a hospital-b; do
  install -d -o root -g xsilo -m 0750 "/var/lib/xsilo/data/$name"
done
awk 'NR == 1 || NR % 2 == 0' data/breast_cancer.csv >/var/lib/xsilo/data/hospital-a/train.csv
awk 'NR == 1 || NR % 2 == 1' data/breast_cancer.csv >/var/lib/xsilo/data/hospital-b/train.csv
chown root:xsilo /var/lib/xsilo/data/*/train.csv
chmod 0640 /var/lib/xsilo/data/*/train.csv

# The server's config, edited in place (it is the conffile an operator edits): loopback on a
# free port, the two hospitals, 2 rounds, short deadlines.
/usr/bin/python3 - <<'EOF'
import json
p = "/etc/xsilo/server.json"
c = json.load(open(p))
c.update({"listen": "127.0.0.1:0", "port_file": "/var/lib/xsilo/server/port", "rounds": 2,
          "allow": {"silo": ["hospital-a", "hospital-b"]},
          "deadlines": {"join_s": 20, "train_s": 60, "upload_s": 30}})
json.dump(c, open(p, "w"), indent=2)
EOF
[ "$(config_value /etc/xsilo/server.json state_dir)" = "/var/lib/$(unit_value xsilo-server.service StateDirectory)" ] ||
  fail "the server config's state_dir is not its unit's StateDirectory"

# --- the federation --------------------------------------------------------------------------
start_unit xsilo-server.service "" "$work/server.log"
server_pid=${pids[-1]}
for _ in $(seq 300); do
  [ -s /var/lib/xsilo/server/port ] && break
  kill -0 "$server_pid" 2>/dev/null || fail "the server exited at start"
  sleep 0.1
done
port=$(cat /var/lib/xsilo/server/port 2>/dev/null) || fail "the server wrote no port file"

# Each silo's config as its operator would write it: a copy of the example with its own name.
agent_pids=()
for name in hospital-a hospital-b; do
  /usr/bin/python3 - "$name" "$port" <<'EOF'
import json, sys
name, port = sys.argv[1], sys.argv[2]
c = json.load(open("/etc/xsilo/agent.json"))
c.update({"upstreams": ["127.0.0.1:" + port], "tls": {"kit": "kits/" + name},
          "trust": {"server": ["server"]}, "state_dir": "/var/lib/xsilo/agent-" + name})
c["data"]["train"] = "/var/lib/xsilo/data/%s/train.csv" % name
c["reconnect"]["max_attempts"] = 20
json.dump(c, open("/etc/xsilo/agent-%s.json" % name, "w"), indent=2)
EOF
  [ "$(config_value "/etc/xsilo/agent-$name.json" state_dir)" = "/var/lib/$(unit_value xsilo-agent@.service StateDirectory "$name")" ] ||
    fail "agent-$name.json's state_dir is not its unit's StateDirectory"
  start_unit xsilo-agent@.service "$name" "$work/agent-$name.log"
  agent_pids+=("${pids[-1]}")
done

for p in "$server_pid" "${agent_pids[@]}"; do
  rc=0
  wait "$p" || rc=$?
  [ "$rc" -eq 0 ] || fail "a daemon (pid $p) exited with $rc"
done
pids=()
say "server and agents hospital-a, hospital-b ran as xsilo from the units' command lines and exited 0"
for f in server agent-hospital-a agent-hospital-b; do
  echo "  $f: $(grep -E 'federation (finished|end)' "$work/$f.log" | tail -n 1)"
done

# The server's state: the audit log verifies, with both silos' witnessed heads, and has every
# round committed.
state=/var/lib/xsilo/server
/usr/bin/xsilo audit verify "$state/audit.jsonl" --key "$state/audit.pub" \
  --witness /var/lib/xsilo/agent-hospital-a/audit_heads.jsonl \
  --witness /var/lib/xsilo/agent-hospital-b/audit_heads.jsonl >"$work/audit.log" 2>&1 ||
  { cat "$work/audit.log" >&2; fail "xsilo audit verify"; }
committed=$(/usr/bin/python3 -c '
import json, sys
print(sum(1 for l in open(sys.argv[1]) if json.loads(l).get("status") == "committed"))' "$state/audit.jsonl")
[ "$committed" -eq 2 ] || fail "$committed rounds committed, expected 2"
[ "$(stat -c %U "$state/audit.key")" = xsilo ] || fail "the audit key is not the user xsilo's"
say "audit verify: $(grep '^OK' "$work/audit.log"); $committed rounds committed"

# A reinstall (an upgrade does the same) keeps the edited conffile, the kits and the state.
sum_before=$(sha256sum /etc/xsilo/server.json)
DEBIAN_FRONTEND=noninteractive dpkg -i --force-confold "$deb" >"$work/dpkg-reinstall.log" 2>&1 ||
  { cat "$work/dpkg-reinstall.log" >&2; fail "dpkg -i again"; }
[ "$(sha256sum /etc/xsilo/server.json)" = "$sum_before" ] || fail "reinstalling changed /etc/xsilo/server.json"
[ -f /etc/xsilo/kits/server/key.pem ] && [ -f "$state/audit.key" ] || fail "reinstalling lost a kit or the state"
say "reinstall kept the edited server.json, the kits and the state"

# --- bad configs: exit 2 and one line naming the file, the key and the reason ----------------
expect_config_error() {  # WHAT EXPECTED_LINE_PART UNIT INSTANCE
  local rc=0 cmd
  read -r -a cmd <<<"$(unit_value "$3" ExecStart "$4")"
  setpriv --reuid=xsilo --regid=xsilo --init-groups -- "${cmd[@]}" >"$work/bad.log" 2>&1 || rc=$?
  [ "$rc" -eq 2 ] || { cat "$work/bad.log" >&2; fail "$1: exit code $rc, expected 2"; }
  grep -qF -- "$2" "$work/bad.log" || { cat "$work/bad.log" >&2; fail "$1: no line with '$2'"; }
  say "$1: exit 2: $(grep -F -- "$2" "$work/bad.log")"
}
cp /etc/xsilo/server.json "$work/server.json.good"
head -c 200 "$work/server.json.good" >/etc/xsilo/server.json  # cut short, as by a full disk
expect_config_error "truncated server.json" "config /etc/xsilo/server.json: not valid JSON" xsilo-server.service ""
/usr/bin/python3 - "$work/server.json.good" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
c["transport"]["heartbeet_s"] = 5
json.dump(c, open("/etc/xsilo/server.json", "w"), indent=2)
EOF
expect_config_error "unknown key in server.json" "config /etc/xsilo/server.json: .transport.heartbeet_s: unknown key" \
  xsilo-server.service ""
# A foreign config: the server's file where hospital-a's agent config belongs.
cp "$work/server.json.good" /etc/xsilo/agent-hospital-a.json
expect_config_error "server config as agent-hospital-a.json" "config /etc/xsilo/agent-hospital-a.json: ." \
  xsilo-agent@.service hospital-a

t_run=$(($(date +%s) - t0))
# --- purge -----------------------------------------------------------------------------------
dpkg --purge xsilo >"$work/purge.log" 2>&1 || { cat "$work/purge.log" >&2; fail "dpkg --purge"; }
for f in /usr/bin/xsilo /lib/systemd/system/xsilo-server.service /etc/xsilo/server.json /var/log/xsilo; do
  [ ! -e "$f" ] || fail "$f is left after dpkg --purge"
done
[ -d /var/lib/xsilo/server ] || fail "dpkg --purge deleted the server's state (it must keep it)"
! dpkg-statoverride --list /etc/xsilo >/dev/null 2>&1 || fail "the statoverride of /etc/xsilo is left after purge"
say "purged: binary, units, conffiles, logs and statoverride gone; state, kits and own configs kept (the test deletes them)"
say "PASSED: build ${t_build}s, install and federation $((t_run))s"
