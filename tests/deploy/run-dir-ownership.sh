#!/usr/bin/env bash
# The local deploy scripts refuse a run directory that is not the caller's alone, and `stop`
# never signals a process they did not start (deploy/lib/owned-dir.sh). Needs root (to hand a
# directory to another user) and the unix user shoal-test-a (.ci/run creates it); without them
# it says so and exits 0, unless SHOAL_REQUIRE_UNIX_USERS=1.
#
#   tests/deploy/run-dir-ownership.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CLUSTER=$ROOT/deploy/local/cluster.sh
AGENTS=$ROOT/deploy/local-agents.sh
if [[ $(id -u) != 0 ]] || ! id shoal-test-a >/dev/null 2>&1; then
  [[ ${SHOAL_REQUIRE_UNIX_USERS:-0} == 1 ]] && { echo "FAIL: needs root and the user shoal-test-a" >&2; exit 1; }
  echo "skipped: needs root and the user shoal-test-a"; exit 0
fi
T=$(mktemp -d); chmod 755 "$T"
VICTIM=
MAIN=$BASHPID
# Only the test's own shell cleans up (a subshell that inherited the trap must not).
cleanup() { [[ $BASHPID == "$MAIN" ]] || return 0; [[ -n $VICTIM ]] && kill "$VICTIM" 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
# expect_refusal WHAT CMD...: CMD exits 1 and says "refusing".
expect_refusal() {
  local what=$1 out st=0; shift
  out=$("$@" 2>&1) || st=$?
  [[ $st == 1 && $out == *refusing* ]] || fail "$what: expected a refusal (exit 1), got exit $st: $out"
  echo "ok: $what (${out%%$'\n'*})"
}
# A process of ours that a planted pid file names; nothing may signal it.
sleep 60 & VICTIM=$!

# 1. A directory another user made at the predictable path: start refuses it and leaves its
# contents alone; stop and status refuse it and signal nothing.
D=$T/foreign; mkdir -p "$D/pids"; echo "$VICTIM" > "$D/pids/r1-a1.pid"; echo theirs > "$D/r1-ca.pem"
chown -R shoal-test-a "$D"
expect_refusal "cluster.sh start, run dir of another user" env RUN_DIR="$D" SHOAL=/bin/true "$CLUSTER" start
[[ $(cat "$D/r1-ca.pem") == theirs ]] || fail "start touched another user's run dir"
expect_refusal "cluster.sh stop, run dir of another user" env RUN_DIR="$D" "$CLUSTER" stop
expect_refusal "cluster.sh status, run dir of another user" env RUN_DIR="$D" "$CLUSTER" status
expect_refusal "local-agents.sh start, dir of another user" env SHOAL=/bin/true "$AGENTS" 1 "$D"
expect_refusal "local-agents.sh stop, dir of another user" "$AGENTS" stop "$D"

# 2. Ours, but writable by group or others, or holding another user's file.
W=$T/writable; mkdir -m 0770 "$W"
expect_refusal "cluster.sh start, group-writable run dir" env RUN_DIR="$W" SHOAL=/bin/true "$CLUSTER" start
F=$T/planted; mkdir -m 0700 "$F"; mkdir "$F/r1"; chown shoal-test-a "$F/r1"
expect_refusal "cluster.sh start, another user's file inside" env RUN_DIR="$F" SHOAL=/bin/true "$CLUSTER" start

# 3. Ours, with a pid file naming a process the script did not start: stop removes the file and
# does not signal it; status reports it DOWN.
O=$T/ours; mkdir -m 0700 "$O"; mkdir -m 0700 "$O/pids"; echo "$VICTIM" > "$O/pids/r1-a1.pid"
out=$(RUN_DIR="$O" "$CLUSTER" status)
[[ $out == "r1-a1 $VICTIM DOWN" ]] || fail "status of a planted pid: $out"
RUN_DIR="$O" "$CLUSTER" stop >/dev/null
kill -0 "$VICTIM" 2>/dev/null || fail "cluster.sh stop killed a process it did not start"
[[ ! -e $O/pids/r1-a1.pid ]] || fail "cluster.sh stop left the stale pid file"
echo "ok: cluster.sh stop and status ignore a pid it did not start"
echo "$VICTIM" > "$O/node-1.pid"
"$AGENTS" stop "$O" >/dev/null
kill -0 "$VICTIM" 2>/dev/null || fail "local-agents.sh stop killed a process it did not start"
echo "ok: local-agents.sh stop ignores a pid it did not start"

# 4. A symlink another user planted at the predictable path in a sticky directory (as /tmp),
# pointing at a private directory of the caller's, given with a trailing slash (which makes
# `stat` follow it): start must refuse, not empty the caller's directory.
P=$T/public; mkdir -m 1777 "$P"
MINE=$T/mine; mkdir -m 0700 "$MINE"; echo precious > "$MINE/notes.txt"
su -s /bin/sh shoal-test-a -c "ln -s '$MINE' '$P/shoal-cluster'"
expect_refusal "cluster.sh start through another user's symlink (trailing slash)" env RUN_DIR="$P/shoal-cluster/" SHOAL=/bin/true REGIONS=1 AUTHORITIES=1 AGENTS=1 "$CLUSTER" start
expect_refusal "local-agents.sh start through another user's symlink (trailing slash)" env SHOAL=/bin/true "$AGENTS" 1 "$P/shoal-cluster/"
[[ $(cat "$MINE/notes.txt" 2>/dev/null) == precious ]] || fail "start emptied the directory another user's symlink pointed at"

# 5. A run dir of ours under a directory another user owns: they could move it away after the
# check and put one of theirs (with a fake agent socket) in its place.
U=$T/theirs; mkdir -m 0755 "$U"; chown shoal-test-a "$U"; mkdir -m 0700 "$U/run"
expect_refusal "cluster.sh start under another user's directory" env RUN_DIR="$U/run" SHOAL=/bin/true "$CLUSTER" start

# 5b. A '..' that steps out of another user's directory (they could swap what it walks
# through between the check and the use).
mkdir -m 0755 "$U/x"; chown shoal-test-a "$U/x"
expect_refusal "cluster.sh start with '..' through another user's directory" env RUN_DIR="$U/x/../../mine" SHOAL=/bin/true "$CLUSTER" start
[[ $(cat "$MINE/notes.txt" 2>/dev/null) == precious ]] || fail "a '..' path emptied a directory"

# 5c. A directory of ours that this script did not make (RUN_DIR=$HOME by mistake): start
# refuses to empty it.
expect_refusal "cluster.sh start, a directory of ours it did not make" env RUN_DIR="$MINE" SHOAL=/bin/true "$CLUSTER" start
[[ $(cat "$MINE/notes.txt" 2>/dev/null) == precious ]] || fail "start emptied a directory it did not make"
expect_refusal "cluster.sh start KEEP=1, a directory of ours it did not make" env KEEP=1 RUN_DIR="$MINE" SHOAL=/bin/true "$CLUSTER" start
[[ ! -e $MINE/.shoal-cluster-run-dir ]] || fail "KEEP=1 marked a directory it did not make (the next start would empty it)"
# A new run dir in a directory of another user's (sticky or not): nothing is created there.
B=$P/bx; mkdir -m 0777 "$B"; chown shoal-test-a "$B"
expect_refusal "cluster.sh start, a new run dir inside another user's directory" env RUN_DIR="$B/run" SHOAL=/bin/true "$CLUSTER" start
[[ ! -e $B/run ]] || fail "a run dir was created inside another user's directory before the check"

# 5d. Symlinks of root's or ours on the way are fine (a home directory behind a symlink).
ln -s "$O" "$T/our-link"
out=$(RUN_DIR="$T/our-link/" "$CLUSTER" status 2>&1) || fail "status through our own symlink refused: $out"
out=$(env -C "$T/our-link" "$AGENTS" stop . 2>&1) || fail "local-agents.sh stop through our own symlink refused: $out"
echo "ok: a path through our own symlink is accepted"

# 5e. Our symlink pointing at another user's symlink (which they can re-point at any run dir of
# ours): refused, and the run dir it points at now keeps its files.
R=$T/oldrun; mkdir -m 0700 "$R"; echo "made by deploy/local/cluster.sh" > "$R/.shoal-cluster-run-dir"; echo kept > "$R/keep.txt"
mkdir -m 0755 "$P/att"; chown shoal-test-a "$P/att"
su -s /bin/sh shoal-test-a -c "ln -s '$R' '$P/att/l'"
ln -s "$P/att/l" "$T/chain"
expect_refusal "cluster.sh start through our symlink to another user's symlink" env RUN_DIR="$T/chain" SHOAL=/bin/true "$CLUSTER" start
[[ -f $R/keep.txt ]] || fail "a symlink chain through another user's symlink emptied a run dir"
su -s /bin/sh shoal-test-a -c "ln -s '$R' '$P/l2'"
ln -s "$P/l2" "$T/chain2"
expect_refusal "cluster.sh start through our symlink to another user's symlink in a sticky dir" env RUN_DIR="$T/chain2" SHOAL=/bin/true "$CLUSTER" start
[[ -f $R/keep.txt ]] || fail "a symlink chain through another user's symlink emptied a run dir"
# ... and nothing is created where such a path points before the refusal.
expect_refusal "cluster.sh start, a new run dir under another user's symlink" env RUN_DIR="$P/att/l/new" SHOAL=/bin/true "$CLUSTER" start
[[ ! -e $R/new ]] || fail "a directory was created before the path was checked"

# 5f. A newline in the path; a run dir group or others can enter (its sockets would be
# reachable by them).
expect_refusal "cluster.sh start, a newline in the path" env RUN_DIR="$T/a"$'\n'"b" SHOAL=/bin/true "$CLUSTER" start
G=$T/open; mkdir -m 0755 "$G"
expect_refusal "local-agents.sh start, a run dir others can enter" env SHOAL=/bin/true "$AGENTS" 1 "$G"

# 5g. local-agents.sh: a non-empty directory it did not make is refused (it would overwrite
# node-1.toml), and stop removes only its own node-N.pid files.
J=$T/project; mkdir -m 0700 "$J"; echo mine > "$J/node-1.toml"; echo 1 > "$J/postgres.pid"
expect_refusal "local-agents.sh start, a directory of ours it did not make" env SHOAL=/bin/true "$AGENTS" 1 "$J"
"$AGENTS" stop "$J" >/dev/null
[[ $(cat "$J/node-1.toml") == mine && -f $J/postgres.pid ]] || fail "local-agents.sh changed files it did not make"
echo "ok: local-agents.sh leaves files it did not make"

# 5h. A start or stop of cluster.sh holds RUN_DIR/.lock while it runs: a second start is refused
# and a stop waits for it (here: for a stand-in holder of the lock) before stopping anything.
K=$T/locked; mkdir -m 0700 "$K"; echo "made by deploy/local/cluster.sh" > "$K/.shoal-cluster-run-dir"
flock "$K/.lock" sleep 3 & HOLDER=$!
for _ in $(seq 1 50); do flock -n "$K/.lock" true 2>/dev/null || break; sleep 0.05; done
expect_refusal "cluster.sh start while another start or stop runs" env RUN_DIR="$K" SHOAL=/bin/true "$CLUSTER" start
RUN_DIR="$K" "$CLUSTER" stop >/dev/null
kill -0 "$HOLDER" 2>/dev/null && fail "cluster.sh stop did not wait for the start holding the lock"
echo "ok: cluster.sh stop waits for a start in progress"

# 6. local-agents.sh stop finds the agents it started whatever the spelling of DIR (a trailing
# slash, relative, characters a regular expression would read): the pid file names the
# resolved path. A stand-in process with an agent's command line plays the agent. No `wait`
# here: bash can lose the record of a child reaped meanwhile ("wait_for: No record of
# process") and then blocks until some other child exits (once for 10 minutes in CI).
L="$T/la [1].x"; mkdir -m 0700 "$L"
python3 -c 'import time; time.sleep(600)' agent --config "$L/node-1.toml" &
AGENT=$!
for spelling in "$L/" "la [1].x"; do
  echo "$AGENT" > "$L/node-1.pid"
  env -C "$T" "$AGENTS" stop "$spelling" >/dev/null
  for _ in $(seq 1 50); do kill -0 "$AGENT" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$AGENT" 2>/dev/null; then kill "$AGENT"; fail "local-agents.sh stop '$spelling' left its agent running"; fi
  echo "ok: local-agents.sh stop '$spelling' stops its agent"
  python3 -c 'import time; time.sleep(600)' agent --config "$L/node-1.toml" &
  AGENT=$!
done
kill "$AGENT" 2>/dev/null || true
echo "run-dir-ownership: all checks passed"
