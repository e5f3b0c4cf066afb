# Shared settings for the environment scripts. Sourced, not executed.
# Everything expensive is cached outside the clone so a fresh clone on the same
# machine starts in seconds; a fresh machine rebuilds it by itself.
SNM_CACHE="${SNM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/spot-node-manager}"
mkdir -p "$SNM_CACHE"
SNM_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

log() { printf '[%s] %s\n' "$(basename "$0")" "$*" >&2; }

# apt-get update at most once per script run (apt look-ups need it).
apt_updated=""
apt_install() {
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ -z "$apt_updated" ]; then apt-get update -qq >&2; apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
}

# A free TCP port on loopback.
free_port() {
  python3 - <<'PY'
import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()
PY
}
