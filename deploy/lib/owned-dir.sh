# Sourced (not run) by the local deploy scripts that keep a CA, node keys, configs, sockets and
# pid files in one directory: deploy/local-agents.sh and deploy/local/cluster.sh.
#
# Such a directory must be the current user's alone. A predictable path under /tmp could have
# been made by another local user beforehand, with their own CA and keys in it, a socket of
# theirs where an agent's should be, or pid files naming processes of yours to be signalled by
# `stop`. So nothing is read, written or signalled in it before owned_dir_check passed.

# owned_dir_refuse DIR MESSAGE: the reason on stderr, exit 1.
owned_dir_refuse() {
  printf '%s: refusing %s: %s\n' "$(basename -- "$0")" "$1" "$2" >&2
  exit 1
}

# owned_dir_trusted PATH: true when PATH (not followed) belongs to root or the current user and
# nobody else can rename or replace what is in it: not writable by group or others, unless it
# is a sticky directory (/tmp), where only an entry's owner may rename it.
owned_dir_trusted() {
  local owner mode
  owner=$(stat -c %u -- "$1") && mode=$(stat -c %a -- "$1") || return 1
  [[ $owner == 0 || $owner == "$(id -u)" ]] || return 1
  [[ -d $1 && ! -L $1 ]] && (( (8#$mode & 8#1000) != 0 )) && return 0
  (( (8#$mode & 8#022) == 0 ))
}

# owned_dir_check DIR: exits 1 unless
# - every symlink met on the way to DIR, as given (a trailing slash follows the last one too),
#   belongs to root or the current user and sits in a directory nobody else can change: a
#   symlink of another user's in /tmp would otherwise send the caller into a directory of the
#   attacker's choosing (one of the caller's own, to be emptied by `start`);
# - every directory above DIR (resolved) is trusted the same way, so nobody can swap DIR for
#   one of theirs after the check (a fake agent socket where the real one was);
# - DIR is a directory of the current user that group and others cannot write, with nothing
#   under it owned by another user or writable by group or others (sockets and symlinks: owner
#   only; their mode bits grant no write to the name).
# Callers go on with the resolved path only (cd -P), never the one given.
owned_dir_check() {
  local dir=$1 me real abs prefix part bad parts
  me=$(id -u)
  [[ $dir == /* ]] && abs=$dir || abs=$PWD/$dir
  IFS=/ read -r -a parts <<<"$abs"
  prefix=""
  for part in "${parts[@]}"; do
    [[ -n $part && $part != . ]] || continue
    prefix=$prefix/$part
    if [[ -L $prefix ]]; then
      owned_dir_trusted "$prefix" && owned_dir_trusted "$(dirname -- "$prefix")" ||
        owned_dir_refuse "$dir" "the path goes through the symlink $prefix ($(stat -c 'owner %U, in a directory of %U' -- "$prefix" 2>/dev/null)), which another user owns or could replace; give the directory's real path"
    fi
  done
  real=$(cd -P -- "$dir" 2>/dev/null && pwd) || owned_dir_refuse "$dir" "cannot enter it"
  [[ -d $real ]] || owned_dir_refuse "$dir" "not a directory"
  prefix=$real
  while [[ $prefix != / ]]; do
    prefix=$(dirname -- "$prefix")
    owned_dir_trusted "$prefix" ||
      owned_dir_refuse "$dir" "$prefix (above it) is owned by $(stat -c '%U, mode %a' -- "$prefix"): another user could move the directory away and put one of theirs in its place; use a directory under one that only you and root can write (or a sticky one such as /tmp)"
  done
  local owner mode
  owner=$(stat -c %u -- "$real"); mode=$(stat -c %a -- "$real")
  [[ $owner == "$me" ]] || owned_dir_refuse "$dir" "$real is owned by uid $owner ($(stat -c %U -- "$real")), not by you (uid $me); another user could have put their own CA and keys in it, replaced the agents' sockets or named your processes in its pid files. Remove it or use a directory of your own"
  (( (8#$mode & 8#022) == 0 )) || owned_dir_refuse "$dir" "$real has mode $mode, writable by group or others; run: chmod 700 $real"
  bad=$(find "$real/" -mindepth 1 \( ! -user "$me" -o \( ! -type s ! -type l -perm /022 \) \) \
    -printf '  %p (owner %u, mode %m)\n' 2>&1 | head -5)
  [[ -z $bad ]] || owned_dir_refuse "$dir" "files in it belong to another user or are writable by group or others (keys, configs and sockets must be yours alone); remove them or the directory:
$bad"
}

# owned_dir_make DIR: creates DIR with mode 0700 if nothing has that name, then checks it. Not
# `mkdir -p` for DIR itself: if someone else made it meanwhile, mkdir fails and the check judges
# theirs.
owned_dir_make() {
  local dir=$1
  if [[ ! -e $dir && ! -L $dir ]]; then
    mkdir -p -- "$(dirname -- "$dir")"
    mkdir -m 0700 -- "$dir" 2>/dev/null || true
  fi
  owned_dir_check "$dir"
}
