#!/usr/bin/env bash
# Builds the shoal container images with no registry and no base image (`FROM scratch`):
#
#   deploy/container/build.sh              cargo build --release, then images shoal:dev, shoal-demo:dev
#   PROFILE=debug deploy/container/build.sh   use target/debug (what CI does: it already built it)
#   SKIP_BUILD=1 ...                        do not run cargo, use the binaries already built
#   TAG=1.2.3 ...                           image tag (default: dev)
#   SIM=1 ...                               also image shoal-sim:TAG (simulator + scenarios, for
#                                           the seed-sweep Job in deploy/k8s/sim-sweep.yaml)
#
# Images:
#   shoal:TAG       /usr/local/bin/shoal (agent, authority, operator CLI). The entrypoint is
#                   `shoal`, so `docker run shoal:dev agent --config ...` runs an agent and
#                   `... authority run --config ...` an authority replica.
#   shoal-demo:TAG  shoal-demo (demo backend, load client) plus `shoal`, entrypoint `shoal-demo`.
# Both run as the unprivileged user shoal (uid/gid 10001) and hold only the binaries, the shared
# libraries `ldd` lists for them (glibc, libgcc_s, the loader), /etc/passwd, /etc/group,
# /etc/nsswitch.conf, a 1777 /tmp and the shoal-owned /run/shoal (socket) and /var/lib/shoal
# (data). Debug info is stripped from the copies (objcopy --strip-debug); the build tree keeps it.
# Prints each image's size. Needs: docker, objcopy (binutils), ldd.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PROFILE=${PROFILE:-release}
TAG=${TAG:-dev}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=$TARGET/$PROFILE
UID_GID=10001

if [[ ${SKIP_BUILD:-0} != 1 ]]; then
  flags=(--locked -p shoal-cli -p shoal-demo)
  [[ ${SIM:-0} == 1 ]] && flags+=(-p shoal-sim)
  [[ $PROFILE == release ]] && flags+=(--release)
  (cd "$ROOT" && cargo build "${flags[@]}")
fi
for b in shoal shoal-demo; do
  [[ -x $BIN/$b ]] || { echo "missing $BIN/$b (build it, or unset SKIP_BUILD)" >&2; exit 1; }
done
command -v objcopy >/dev/null || { echo "objcopy not found (apt-get install binutils)" >&2; exit 1; }

# assemble DIR BINARY...: a context directory with rootfs/ and state/ for the Dockerfile.
assemble() {
  local ctx=$1; shift
  mkdir -p "$ctx/rootfs/usr/local/bin" "$ctx/rootfs/etc" "$ctx/rootfs/tmp" \
    "$ctx/state/run/shoal" "$ctx/state/var/lib/shoal"
  chmod 1777 "$ctx/rootfs/tmp"
  chmod 0750 "$ctx/state/run/shoal"
  chmod 0700 "$ctx/state/var/lib/shoal"
  local b lib
  for b in "$@"; do
    objcopy --strip-debug "$BIN/$b" "$ctx/rootfs/usr/local/bin/$b"
    # Every resolved library path, and the loader (the line without "=>").
    for lib in $(ldd "$BIN/$b" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'); do
      mkdir -p "$ctx/rootfs$(dirname "$lib")"
      cp -L "$lib" "$ctx/rootfs$lib"
    done
  done
  # The loader is found through /lib64 on x86-64; keep the symlink layout of the host.
  if [[ -L /lib64/ld-linux-x86-64.so.2 && ! -e $ctx/rootfs/lib64/ld-linux-x86-64.so.2 ]]; then
    mkdir -p "$ctx/rootfs/lib64"
    cp -L /lib64/ld-linux-x86-64.so.2 "$ctx/rootfs/lib64/"
  fi
  printf 'root:x:0:0:root:/nonexistent:/nonexistent\nshoal:x:%s:%s:shoal:/var/lib/shoal:/nonexistent\n' \
    "$UID_GID" "$UID_GID" > "$ctx/rootfs/etc/passwd"
  printf 'root:x:0:\nshoal:x:%s:\n' "$UID_GID" > "$ctx/rootfs/etc/group"
  printf 'passwd: files\ngroup: files\nhosts: files dns\n' > "$ctx/rootfs/etc/nsswitch.conf"
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
assemble "$work/shoal" shoal
cp "$ROOT/deploy/container/Dockerfile" "$work/shoal/"
assemble "$work/demo" shoal-demo shoal
sed -e 's|^ENTRYPOINT .*|ENTRYPOINT ["/usr/local/bin/shoal-demo"]|' \
  "$ROOT/deploy/container/Dockerfile" > "$work/demo/Dockerfile"

images=("shoal:$work/shoal" "shoal-demo:$work/demo")
if [[ ${SIM:-0} == 1 ]]; then
  [[ -x $BIN/shoal-sim ]] || { echo "missing $BIN/shoal-sim" >&2; exit 1; }
  assemble "$work/sim" shoal-sim
  mkdir -p "$work/sim/rootfs/usr/share/shoal"
  cp -r "$ROOT/simulations/scenarios" "$work/sim/rootfs/usr/share/shoal/scenarios"
  sed -e 's|^ENTRYPOINT .*|ENTRYPOINT ["/usr/local/bin/shoal-sim"]|' \
    -e 's|^WORKDIR .*|WORKDIR /usr/share/shoal|' \
    "$ROOT/deploy/container/Dockerfile" > "$work/sim/Dockerfile"
  images+=("shoal-sim:$work/sim")
fi

# The classic builder: FROM scratch needs no registry and no frontend image.
export DOCKER_BUILDKIT=0
for pair in "${images[@]}"; do
  name=${pair%%:*} dir=${pair#*:}
  # Its deprecation notice is noise here; the output is shown when the build fails.
  docker build -q -t "$name:$TAG" "$dir" >"$work/build.log" 2>&1 || { cat "$work/build.log" >&2; exit 1; }
done
for pair in "${images[@]}"; do
  img=${pair%%:*}:$TAG
  size=$(docker image inspect -f '{{.Size}}' "$img")
  printf '%s\t%s bytes (%s MiB)\n' "$img" "$size" "$(( size / 1048576 ))"
done
