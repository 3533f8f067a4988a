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
echo all steps done
