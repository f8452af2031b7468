#!/usr/bin/env bash
# tests/multinode/agent.sh -- Open MPI's rsh agent for the simulated nodes (tests/multinode/netns.sh):
# called as `agent.sh NODE COMMAND...` (ssh's form: the command is one shell string), it runs the
# command in NODE's network namespace with NODE as its hostname (a UTS namespace of its own).
# The agent stays outside the node, as ssh's client does: when the session dies from a signal (the
# node lost: everything in it killed), it says so, naming the node, as ssh says "Connection to
# NODE closed by remote host".
node=$1
shift
ip netns exec "$node" unshare --uts /bin/sh -c 'hostname "$0"; eval "$1"' "$node" "$*"
code=$?
[ "$code" -gt 128 ] && echo "agent.sh: connection to $node lost (its session ended by signal $(( code - 128 )))" >&2
exit "$code"
