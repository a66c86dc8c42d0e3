#!/usr/bin/env bash
# A --host-exec for the namespace hosts (netns_hosts.sh) that treats the
# command as ssh and sshd do, at their least helpful: the command runs in
# a session of its own (setsid: no signal sent to this wrapper, or to its
# process group, reaches it), its stdin is a pipe that only this wrapper
# process writes, fed from the wrapper's own stdin, and nothing but those
# bytes passes. When this wrapper goes (the "link" dropping, or the
# launcher that owns it dying) the command's stdin closes, as sshd closes
# it when its client goes; nothing else tells the command. Like ssh, the
# wrapper exits with the command's status once the command is done.
# Usage: netns_detached_exec.sh HOST COMMAND [ARGS...]
host=$1
shift
exec 3> >(exec setsid ip netns exec "$host" "$@")
pid=$!
while kill -0 "$pid" 2>/dev/null; do
  if IFS= read -r -t 0.2 line; then
    printf '%s\n' "$line" >&3 || break
  elif [ $? -le 128 ]; then
    break  # end of our stdin: pass it on
  fi
done
exec 3>&-
wait "$pid"
