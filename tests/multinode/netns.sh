# tests/multinode/netns.sh -- simulated nodes on one machine, for the multi-node tests (sourced).
#
# As root, each "node" is a network namespace (its own interfaces and address) with a hostname
# of its own (a UTS namespace per process launched there), joined to the others by a bridge that
# lives in a namespace of its own: a private subnet the test makes, no real interface touched.
# Open MPI launches onto the nodes through an rsh agent that runs its command with
# `ip netns exec NODE unshare --uts` (tests/multinode/agent.sh), from a hostfile naming the
# namespaces, and talks TCP over the bridge (--mca btl tcp,self, oob/btl_tcp_if_include = the
# subnet). Names carry the run's id, so runs side by side do not meet; nodes_down (trapped on
# EXIT by nodes_up) removes the namespaces, their links and every process in them however the
# test ends.
#
#   nodes_up N            makes N nodes: $nodes (their names), $hostfile, $subnet, $mpirun_net
#                         (mpirun's options for them); exit 77 (CTest skip) with the reason when
#                         namespaces cannot be made here
#   on_node NAME CMD...   runs CMD on node NAME (in its namespace)
#   link_down NAME / link_up NAME      cuts / restores node NAME's link (a partition)
#   link_slow NAME        slows node NAME's outgoing traffic (netem delay, or a tbf rate limit)
#   kill_node NAME        SIGKILLs every process on node NAME (kiln and the launcher's daemon)
#   freeze_daemons NAME   SIGSTOPs the launcher's daemon on node NAME
#   nodes_down            removes everything (also on EXIT)

mn_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mn_id="k$(( $$ % 100000 ))"
mn_switch="${mn_id}sw"
nodes=()

skip() { echo "SKIP: $*"; exit 77; }

nodes_up() {
  local n=$1 i
  [ "$(id -u)" -eq 0 ] || skip "simulated nodes need root (network namespaces)"
  command -v ip >/dev/null || skip "no ip (iproute2)"
  command -v unshare >/dev/null || skip "no unshare (util-linux)"
  ip netns add "$mn_switch" 2>/dev/null || skip "cannot make a network namespace here ($(ip netns add "$mn_switch" 2>&1))"
  trap 'nodes_down; rm -rf "${work:-}"' EXIT  # replaces common.sh's trap, so removes $work too
  subnet="10.213.$(( $$ % 250 + 1 ))"
  ip -n "$mn_switch" link add "${mn_id}br" type bridge
  ip -n "$mn_switch" link set "${mn_id}br" up
  ip -n "$mn_switch" link set lo up
  : >"$work/hostfile"
  for i in $(seq 0 $(( n - 1 ))); do
    local node="${mn_id}n$i"
    ip netns add "$node"
    ip link add "${mn_id}a$i" netns "$node" type veth peer name "${mn_id}b$i" netns "$mn_switch"
    ip -n "$node" addr add "$subnet.$(( 10 + i ))/24" dev "${mn_id}a$i"
    ip -n "$node" link set "${mn_id}a$i" up
    ip -n "$node" link set lo up
    ip -n "$mn_switch" link set "${mn_id}b$i" master "${mn_id}br"
    ip -n "$mn_switch" link set "${mn_id}b$i" up
    nodes+=("$node")
    echo "$node slots=${MN_SLOTS:-2}" >>"$work/hostfile"
  done
  hostfile="$work/hostfile"
  # Open MPI: launch through the agent, TCP on the subnet only, no shared memory between nodes
  # (tcp,self: every peer over TCP, as across real nodes), root allowed.
  mpirun_net=(--allow-run-as-root --hostfile "$hostfile" --mca plm_rsh_agent "$mn_here/agent.sh"
              --mca btl tcp,self --mca btl_tcp_if_include "$subnet.0/24" --mca oob_tcp_if_include "$subnet.0/24")
  local v
  for v in PATH LD_LIBRARY_PATH; do [ -z "${!v:-}" ] || mpirun_net+=(-x "$v"); done
}

# The pids of kiln's live processes on node NAME (not zombies: a process that has ended but that
# its parent, the launcher's daemon, has not reaped yet -- a frozen daemon never does).
kiln_pids() {
  local p state
  for p in $(ip netns pids "$1" 2>/dev/null); do
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "kiln" ] || continue
    state=$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' "/proc/$p/status" 2>/dev/null)
    case "$state" in Z|X|"") ;; *) echo "$p" ;; esac
  done
  return 0
}

on_node() { local node=$1; shift; ip netns exec "$node" unshare --uts sh -c 'hostname "$0"; exec "$@"' "$node" "$@"; }

node_index() { local node=$1; echo "${node##*n}"; }
link_down() { ip -n "$mn_switch" link set "${mn_id}b$(node_index "$1")" down; }
link_up() { ip -n "$mn_switch" link set "${mn_id}b$(node_index "$1")" up; }
# link_slow NAME: slows node NAME's outgoing traffic: a 20 ms delay (netem) where the kernel has
# netem, else a rate limit of 100 Mbit/s (tbf; the queue holds a second, so nothing is dropped).
# Sets $slow_how to what it did.
link_slow() {
  local dev="${mn_id}a$(node_index "$1")"
  if ip netns exec "$1" tc qdisc add dev "$dev" root netem delay 20ms 2>/dev/null; then
    slow_how="netem delay 20 ms"
  else
    ip netns exec "$1" tc qdisc add dev "$dev" root tbf rate 100mbit burst 64kbit latency 1s
    slow_how="tbf rate 100 Mbit/s (this kernel has no netem)"
  fi
}
kill_node() { local p; for p in $(ip netns pids "$1"); do kill -9 "$p" 2>/dev/null || true; done; }
# freeze_daemons NAME: SIGSTOPs the launcher's daemons (orted, prted) on node NAME: a daemon that
# can no longer answer, so MPI_Abort on that node cannot complete.
freeze_daemons() {
  local p
  for p in $(ip netns pids "$1"); do
    case "$(cat "/proc/$p/comm" 2>/dev/null)" in orted|prted) kill -STOP "$p" ;; esac
  done
}

nodes_down() {
  local node p
  for node in "${nodes[@]}" "$mn_switch"; do
    for p in $(ip netns pids "$node" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
  done
  for node in "${nodes[@]}" "$mn_switch"; do ip netns del "$node" 2>/dev/null || true; done
  nodes=()
}
