#!/usr/bin/env bash
# A multi-host test bed on one Linux machine: N network namespaces ("hosts") joined by a bridge.
# The bridge lives in a namespace of its own, so nothing is added to the caller's namespace.
#
#   netns_bed.sh up   PREFIX N     hosts PREFIX-h0..h{N-1} at 10.77.0.1..N/24 (eth0), bridge PREFIX-sw
#   netns_bed.sh down PREFIX       deletes every namespace of the bed (and stops what runs in them)
#   netns_bed.sh cut  PREFIX I     host I drops every packet on eth0, both directions (nftables);
#                                  prints the wall-clock millisecond at which the rules went in
#   netns_bed.sh heal PREFIX I     undoes cut
#   netns_bed.sh blip PREFIX I MS  cut, then heal MS milliseconds later: one running `nft -i`
#                                  takes both, so no process start-up lengthens the cut
#   netns_bed.sh freeze PREFIX I   SIGSTOP to every process on host I, prints the wall-clock
#                                  millisecond it was sent at; thaw sends SIGCONT
#   netns_bed.sh exec PREFIX I CMD...   runs CMD on host I with its own hostname (PREFIX-hI)
#   netns_bed.sh gc                deletes beds whose owner process (PREFIX = tmh<pid>...) is gone
#
# Every bed has its own bridge namespace, so parallel beds may use the same addresses. Exit
# status 3 from `up` means namespaces cannot be created here (not root, no ip, no kernel support).
set -u
cmd=${1:-}
prefix=${2:-}

die() { echo "netns_bed: $*" >&2; exit 1; }

valid_prefix() { [[ "$prefix" =~ ^[a-z][a-z0-9]{1,10}$ ]] || die "bad prefix '$prefix' (lower-case letters and digits, at most 11)"; }

host_ns() { echo "${prefix}-h$1"; }

down() {
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${prefix}-(h[0-9]+|sw)$"); do
    # Stop what still runs in the namespace, then delete it.
    local pids
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  done
  return 0
}

gc() {
  local ns owner prefix  # down() reads prefix; the caller's own stays untouched
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^tmh[0-9]+[a-z0-9]*-(h[0-9]+|sw)$'); do
    owner=$(echo "$ns" | sed -E 's/^tmh([0-9]+).*/\1/')
    if [ ! -d "/proc/$owner" ]; then prefix=${ns%-*}; down; fi
  done
  return 0
}

up() {
  local n=${1:-2} i
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 200 ] || die "bad host count '$n'"
  command -v ip >/dev/null || { echo "netns_bed: 'ip' (iproute2) is not installed" >&2; exit 3; }
  ip netns add "${prefix}-sw" 2>/dev/null || { echo "netns_bed: cannot create network namespaces here (needs root and netns support)" >&2; exit 3; }
  trap 'down' ERR
  set -e
  ip -n "${prefix}-sw" link add br0 type bridge
  ip -n "${prefix}-sw" link set br0 up
  for ((i = 0; i < n; ++i)); do
    local ns
    ns=$(host_ns "$i")
    ip netns add "$ns"
    ip link add eth0 netns "$ns" type veth peer name "p$i" netns "${prefix}-sw"
    ip -n "$ns" addr add "10.77.0.$((i + 1))/24" dev eth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
    ip -n "${prefix}-sw" link set "p$i" master br0
    ip -n "${prefix}-sw" link set "p$i" up
  done
  set +e
  trap - ERR
  # Wait (bounded) until every veth has its carrier and every bridge port forwards.
  for ((i = 0; i < 100; ++i)); do
    local ready=1 j
    for ((j = 0; j < n; ++j)); do
      ip -n "$(host_ns "$j")" -br link show eth0 2>/dev/null | grep -q ' UP ' || ready=0
    done
    [ "$(bridge -n "${prefix}-sw" link show 2>/dev/null | grep -c 'state forwarding')" = "$n" ] || ready=0
    [ "$ready" = 1 ] && return 0
    sleep 0.05
  done
  down
  die "the bridge did not come up within 5 s"
}

# The rules of a cut, one nft transaction.
cut_rules='add table inet troupe_cut; add chain inet troupe_cut in { type filter hook input priority -100; policy accept; }; add chain inet troupe_cut out { type filter hook output priority -100; policy accept; }; add rule inet troupe_cut in iifname "eth0" drop; add rule inet troupe_cut out oifname "eth0" drop'

# Runs in the host's namespace. It starts `nft -i` and waits (bounded) until it answers. Then it
# feeds it the cut and waits $2 seconds: a builtin wait on an idle pipe, no process started.
# When $2 is not empty it then feeds the heal. Fails unless nft listed the cut's table while it
# was in. Prints the wall-clock millisecond just before the cut went in.
nft_cut_script='
  dir=$(mktemp -d) || exit 1
  trap "rm -rf $dir" EXIT
  mkfifo "$dir/cmd" || exit 1
  exec {out}<>"$dir/cmd"
  exec {in}< <(exec {out}>&-; exec nft -i <"$dir/cmd" 2>&1)
  pid=$!
  echo "add table inet troupe_ready; list table inet troupe_ready" >&"$out"
  read -r -t 10 -u "$in" line || exit 1
  exec {idle}<> <(:)
  at=${EPOCHREALTIME/./}
  echo "$1; delete table inet troupe_ready; list table inet troupe_cut" >&"$out"
  if [ -n "$2" ]; then
    read -r -t "$2" -u "$idle"
    echo "delete table inet troupe_cut" >&"$out"
  fi
  exec {out}>&-
  listed=0
  while read -r -t 10 -u "$in" line; do [[ $line == "table inet troupe_cut {" ]] && listed=1; done
  wait "$pid" 2>/dev/null
  [ "$listed" = 1 ] || exit 1
  echo $((at / 1000))
'

cut() {
  local ns at
  ns=$(host_ns "$1")
  command -v nft >/dev/null || die "'nft' (nftables) is not installed"
  at=$(ip netns exec "$ns" bash -c "$nft_cut_script" _ "$cut_rules" "") || die "cannot install the cut on $ns"
  ip netns exec "$ns" nft list table inet troupe_cut >/dev/null 2>&1 || die "cannot install the cut on $ns"
  echo "$at"
}

heal() {
  ip netns exec "$(host_ns "$1")" nft delete table inet troupe_cut 2>/dev/null
  return 0
}

blip() {
  local ns ms
  ns=$(host_ns "$1")
  ms=${2:?milliseconds}
  case $ms in *[!0-9]*|'') die "blip: milliseconds must be a number, got '$ms'" ;; esac
  command -v nft >/dev/null || die "'nft' (nftables) is not installed"
  ip netns exec "$ns" bash -c "$nft_cut_script" _ "$cut_rules" "$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))" >/dev/null \
    || { heal "$1"; die "cannot cut $ns for $ms ms"; }
  heal "$1"  # nothing to undo unless nft stopped early
}

signal_host() {
  local pids
  pids=$(ip netns pids "$(host_ns "$1")" 2>/dev/null)
  [ "$2" = STOP ] && echo $((${EPOCHREALTIME/./} / 1000))
  [ -z "$pids" ] || kill "-$2" $pids
}

case "$cmd" in
  up) valid_prefix; gc; up "${3:-2}" ;;
  down) valid_prefix; down ;;
  cut) valid_prefix; cut "${3:?host index}" ;;
  heal) valid_prefix; heal "${3:?host index}" ;;
  blip) valid_prefix; blip "${3:?host index}" "${4:?milliseconds}" ;;
  freeze) valid_prefix; signal_host "${3:?host index}" STOP ;;
  thaw) valid_prefix; signal_host "${3:?host index}" CONT ;;
  exec)
    valid_prefix
    i=${3:?host index}
    shift 3
    exec ip netns exec "$(host_ns "$i")" unshare --uts sh -c 'hostname "$0" && exec "$@"' "${prefix}-h$i" "$@" ;;
  gc) gc ;;
  *) die "usage: netns_bed.sh up|down|cut|heal|blip|freeze|thaw|exec|gc PREFIX ..." ;;
esac
