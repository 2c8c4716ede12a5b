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

# owned_dir_trusted DIR: true when DIR (a symlink is followed) is a directory of root or the
# current user in which nobody else can rename or replace an entry: not writable by group or
# others, unless it is sticky (/tmp), where only an entry's owner may rename it.
owned_dir_trusted() {
  local owner mode
  [[ -d $1 ]] || return 1
  owner=$(stat -L -c %u -- "$1") && mode=$(stat -L -c %a -- "$1") || return 1
  [[ $owner == 0 || $owner == "$(id -u)" ]] || return 1
  (( (8#$mode & 8#1000) != 0 || (8#$mode & 8#022) == 0 ))
}

# owned_dir_check DIR: exits 1 unless
# - DIR, as given, has no `..` component and passes only through directories nobody but root
#   and the current user can change (owned_dir_trusted), and every symlink on the way (a
#   trailing slash follows the last one too) is root's or the current user's: otherwise another
#   user could point the path, between this check and its use, at a directory of the caller's
#   own (to be emptied by `start`) or at one of theirs;
# - every directory above DIR's resolved path is trusted the same way, so nobody can move DIR
#   away afterwards and put one of theirs (with a fake agent socket) in its place;
# - DIR is a directory of the current user that group and others cannot write, with nothing
#   under it owned by another user or writable by group or others (sockets and symlinks: owner
#   only; their mode bits grant no write to the name).
# On success OWNED_DIR_REAL holds DIR's resolved path, resolved once here: callers use it, never
# the path given (resolving it again could give another answer).
owned_dir_check() {
  local dir=$1 me abs prefix part parts real bad owner mode
  me=$(id -u)
  [[ -n $dir ]] || owned_dir_refuse "''" "an empty path"
  [[ $dir == /* ]] && abs=$dir || abs=$PWD/$dir
  IFS=/ read -r -a parts <<<"$abs"
  prefix=""
  for part in "${parts[@]}"; do
    [[ -n $part && $part != . ]] || continue
    [[ $part != .. ]] || owned_dir_refuse "$dir" "it has a '..' component; give the directory's path without one"
    owned_dir_trusted "${prefix:-/}" ||
      owned_dir_refuse "$dir" "it passes through ${prefix:-/} ($(stat -L -c 'owner %U, mode %a' -- "${prefix:-/}" 2>/dev/null)), where another user could rename or replace what follows; use a directory under ones that only you and root can write (or a sticky one such as /tmp)"
    prefix=$prefix/$part
    if [[ -L $prefix ]]; then
      owner=$(stat -c %u -- "$prefix")
      [[ $owner == 0 || $owner == "$me" ]] ||
        owned_dir_refuse "$dir" "it goes through the symlink $prefix of $(stat -c %U -- "$prefix"), who could point it elsewhere; give the directory's real path"
    fi
  done
  real=$(cd -P -- "$dir" 2>/dev/null && pwd) || owned_dir_refuse "$dir" "cannot enter it"
  prefix=$real
  while [[ $prefix != / ]]; do
    prefix=$(dirname -- "$prefix")
    owned_dir_trusted "$prefix" ||
      owned_dir_refuse "$dir" "$prefix (above its real path $real) is $(stat -c 'owner %U, mode %a' -- "$prefix"): another user could move the directory away and put one of theirs in its place; use a directory under ones that only you and root can write (or a sticky one such as /tmp)"
  done
  owner=$(stat -c %u -- "$real"); mode=$(stat -c %a -- "$real")
  [[ $owner == "$me" ]] || owned_dir_refuse "$dir" "$real is owned by uid $owner ($(stat -c %U -- "$real")), not by you (uid $me); another user could have put their own CA and keys in it, replaced the agents' sockets or named your processes in its pid files. Remove it or use a directory of your own"
  (( (8#$mode & 8#022) == 0 )) || owned_dir_refuse "$dir" "$real has mode $mode, writable by group or others; run: chmod 700 $real"
  bad=$(find "$real/" -mindepth 1 \( ! -user "$me" -o \( ! -type s ! -type l -perm /022 \) \) \
    -printf '  %p (owner %u, mode %m)\n' 2>&1 | head -5)
  [[ -z $bad ]] || owned_dir_refuse "$dir" "files in it belong to another user or are writable by group or others (keys, configs and sockets must be yours alone); remove them or the directory:
$bad"
  OWNED_DIR_REAL=$real
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
