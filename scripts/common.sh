# What the scripts in scripts/ share; source it: . "$(dirname "$0")/common.sh"
# Each script names itself in its messages ($script) and is stopped by the first failure.

script=$(basename "$0" .sh)

# fail MESSAGE: say why on standard error, prefixed by the script's name, and stop.
fail() {
  echo "$script: $*" >&2
  exit 1
}

# need TOOL...: stop, naming the first tool that is not installed.
need() {
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null || fail "$tool is not installed (scripts/install-deps.sh)"
  done
}

# refuse_existing PATH...: unless FORCE=1, stop at the first path that exists (a file that
# is not empty, or a directory that is not), naming what is there.
refuse_existing() {
  [ "${FORCE:-0}" = 1 ] && return 0
  local path
  for path in "$@"; do
    if [ -d "$path" ]; then
      [ -z "$(ls -A "$path")" ] || fail "$path is not empty (it holds $(ls -A "$path" | head -3 | tr '\n' ' ')); it would be overwritten: FORCE=1 to go on"
    elif [ -e "$path" ]; then
      fail "$path exists (it would be overwritten): FORCE=1 to go on"
    fi
  done
}
