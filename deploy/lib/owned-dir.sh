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

# owned_dir_trusted DIR: true when DIR (a real directory, no symlink) belongs to root or the
# current user and nobody else can rename or replace an entry in it: not writable by group or
# others, unless it is sticky (/tmp), where only an entry's owner may rename it.
owned_dir_trusted() {
  local owner mode
  [[ -d $1 && ! -L $1 ]] || return 1
  owner=$(stat -c %u -- "$1") && mode=$(stat -c %a -- "$1") || return 1
  [[ $owner == 0 || $owner == "$(id -u)" ]] || return 1
  (( (8#$mode & 8#1000) != 0 || (8#$mode & 8#022) == 0 ))
}

# owned_dir_resolve PATH: resolves PATH by hand, one component at a time from `/` (a relative
# PATH from the physical working directory), following each symlink itself, and sets
# OWNED_DIR_REAL to the directory reached. Exits 1 (owned_dir_refuse) when any directory it
# passes through is not owned_dir_trusted, or any symlink met (in PATH or in a symlink's
# target, at any depth) belongs to someone other than root and the current user: such a user
# could point the path, between this check and its use, at a directory of the caller's own (to
# be emptied by `start`) or at one of theirs. `..` steps up from the directory reached so far,
# which is real and was checked on the way down. The directory reached must be trusted as well.
# Nothing is created.
owned_dir_resolve() {
  local path=$1 me cur comp target hops=0 owner
  local -a queue more
  me=$(id -u)
  [[ -n $path ]] || owned_dir_refuse "''" "an empty path"
  [[ $path != *$'\n'* ]] || owned_dir_refuse "$path" "the path has a newline in it"
  [[ $path == /* ]] || path=$(pwd -P)/$path
  IFS=/ read -r -a queue <<<"$path"
  cur=/
  while ((${#queue[@]})); do
    comp=${queue[0]}; queue=("${queue[@]:1}")
    [[ -n $comp && $comp != . ]] || continue
    if [[ $comp == .. ]]; then cur=$(dirname -- "$cur"); continue; fi
    owned_dir_trusted "$cur" ||
      owned_dir_refuse "$1" "it passes through $cur ($(stat -c 'owner %U, mode %a' -- "$cur" 2>/dev/null)), where another user could rename or replace what follows; use a directory under ones that only you and root can write (or a sticky one such as /tmp)"
    local next=${cur%/}/$comp
    if [[ -L $next ]]; then
      owner=$(stat -c %u -- "$next")
      [[ $owner == 0 || $owner == "$me" ]] ||
        owned_dir_refuse "$1" "it goes through the symlink $next of $(stat -c %U -- "$next"), who could point it elsewhere; give the directory's real path"
      (( ++hops <= 40 )) || owned_dir_refuse "$1" "too many symlinks"
      target=$(readlink -- "$next")
      [[ $target != *$'\n'* ]] || owned_dir_refuse "$1" "the symlink $next has a newline in its target"
      IFS=/ read -r -a more <<<"$target"
      queue=("${more[@]}" "${queue[@]}")
      [[ $target == /* ]] && cur=/
      continue
    fi
    [[ -d $next ]] || owned_dir_refuse "$1" "$next is not a directory"
    cur=$next
  done
  # The directory reached is judged too: a caller may create something in it next.
  owned_dir_trusted "$cur" ||
    owned_dir_refuse "$1" "$cur ($(stat -c 'owner %U, mode %a' -- "$cur" 2>/dev/null)) is not a directory that only you and root can change"
  OWNED_DIR_REAL=$cur
}

# owned_dir_check DIR: exits 1 unless DIR resolves (owned_dir_resolve: through directories and
# symlinks only root and the current user control) to a directory of the current user that
# group and others cannot enter (its agents' sockets are reachable by whoever can), with
# nothing under it owned by another user or writable by group or others (sockets and symlinks:
# owner only; their mode bits grant no write to the name). On success OWNED_DIR_REAL holds the
# resolved path, resolved once here: callers use it, never the path given (resolving it again
# could give another answer).
owned_dir_check() {
  local dir=$1 me real bad owner mode
  me=$(id -u)
  owned_dir_resolve "$dir"
  real=$OWNED_DIR_REAL
  owner=$(stat -c %u -- "$real"); mode=$(stat -c %a -- "$real")
  [[ $owner == "$me" ]] || owned_dir_refuse "$dir" "$real is owned by uid $owner ($(stat -c %U -- "$real")), not by you (uid $me); another user could have put their own CA and keys in it, replaced the agents' sockets or named your processes in its pid files. Remove it or use a directory of your own"
  (( (8#$mode & 8#077) == 0 )) || owned_dir_refuse "$dir" "$real has mode $mode: group or others can enter it (and reach the agents' sockets); run: chmod 700 $real"
  bad=$(find "$real/" -mindepth 1 \( ! -user "$me" -o \( ! -type s ! -type l -perm /022 \) \) \
    -printf '  %p (owner %u, mode %m)\n' 2>&1 | head -5)
  [[ -z $bad ]] || owned_dir_refuse "$dir" "files in it belong to another user or are writable by group or others (keys, configs and sockets must be yours alone); remove them or the directory:
$bad"
}

# owned_dir_make DIR: when nothing has DIR's name, resolves its parent first (which must exist:
# nothing is created before that check) and creates DIR there with mode 0700; then checks DIR.
# Not `mkdir -p` for DIR itself: if someone else made it meanwhile, mkdir fails and the check
# judges theirs. Sets OWNED_DIR_REAL.
owned_dir_make() {
  local dir=$1 parent
  if [[ ! -e $dir && ! -L $dir ]]; then
    parent=$(dirname -- "$dir")
    [[ -d $parent ]] || owned_dir_refuse "$dir" "its parent $parent does not exist; create it first"
    owned_dir_resolve "$parent"
    mkdir -m 0700 -- "${OWNED_DIR_REAL%/}/$(basename -- "$dir")" 2>/dev/null || true
    dir=${OWNED_DIR_REAL%/}/$(basename -- "$dir")
  fi
  owned_dir_check "$dir"
}
