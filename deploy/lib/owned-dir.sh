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

# owned_dir_check DIR: exits 1 unless DIR (as given, and as resolved) is a directory of the
# current user that group and others cannot write, with nothing under it owned by another user
# or writable by group or others (sockets and symlinks: owner only; their mode bits grant no
# write to the name).
owned_dir_check() {
  local dir=$1 me owner mode bad path
  me=$(id -u)
  for path in "$dir" "$(cd -P -- "$dir" 2>/dev/null && pwd)"; do
    [[ -n $path ]] || owned_dir_refuse "$dir" "cannot enter it"
    [[ -d $path ]] || owned_dir_refuse "$dir" "not a directory"
    owner=$(stat -c %u -- "$path"); mode=$(stat -c %a -- "$path")
    [[ $owner == "$me" ]] || owned_dir_refuse "$dir" "$path is owned by uid $owner ($(stat -c %U -- "$path")), not by you (uid $me); another user could have put their own CA and keys in it, replaced the agents' sockets or named your processes in its pid files. Remove it or use a directory of your own"
    (( (8#$mode & 8#022) == 0 )) || owned_dir_refuse "$dir" "$path has mode $mode, writable by group or others; run: chmod 700 $path"
  done
  bad=$(find "$dir/" -mindepth 1 \( ! -user "$me" -o \( ! -type s ! -type l -perm /022 \) \) \
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
