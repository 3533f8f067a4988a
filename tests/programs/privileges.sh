# Programs that change user or sandbox themselves, as an operator meets
# them on day one (run as root).
set -e
id -u
/usr/sbin/runuser -u nobody -- id -u
su -s /bin/sh nobody -c 'id -u; id -G'
setpriv --reuid=65534 --regid=65534 --init-groups id
# A daemon dropping to a service user.
/sbin/start-stop-daemon --start --name rtprof-none --chuid nobody:nogroup \
    --startas /bin/sh -- -c 'echo daemon as $(id -un)'
# man-db runs its filters (zcat, groff) under a seccomp filter of their
# own, and drops to its own user when run as root.
man -P cat ls > ls.txt
grep -c 'list directory contents' ls.txt
# Capabilities given up by capsh and setpriv; a shell reads its own.
/usr/sbin/capsh --drop=cap_sys_admin,cap_net_raw -- -c 'grep CapBnd /proc/self/status'
setpriv --bounding-set=-all --inh-caps=-all -- sh -c 'grep CapEff /proc/self/status'
# firejail makes its sandbox with clone() and changes credentials there;
# bwrap its namespaces, and a seccomp filter from a file (killing statx).
firejail --quiet --noprofile /bin/echo in firejail
bwrap --bind / / --unshare-pid /bin/echo in bwrap
# libseccomp's filter killing statx (332), as `tests/c/filters.c bpf statx`
# writes it.
printf '%s' 'IAAAAAQAAAAVAAAGPgAAwCAAAAAAAAAANQAAAQAAAEAVAAAD/////xUAAQBMAQAABgAAAAAA/38GAAAAAAAAgAYAAAAAAAAA' | base64 -d > statx.bpf
bwrap --bind / / --seccomp 9 /bin/echo under a filter 9<statx.bpf
echo all steps done
