#!/bin/sh
# Builds the Debian package rtprof_VERSION_ARCH.deb from a release build,
# with dpkg-deb alone (no cargo-deb): the files are staged in a temporary
# tree, owned by root in the archive.
#
#   cargo build --release --workspace
#   packaging/build-deb.sh [BUILD_DIR [OUT_DIR]]
#
# BUILD_DIR holds rtprof, rtprofd and librtprof.so (default:
# target/release); the package goes to OUT_DIR (default: target/debian),
# and its path is printed.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
build=${1:-$repo/target/release}
out=${2:-$repo/target/debian}

for f in rtprof rtprofd librtprof.so; do
    if [ ! -f "$build/$f" ]; then
        echo "build-deb.sh: $build/$f is missing (cargo build --release --workspace)" >&2
        exit 1
    fi
done

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/Cargo.toml" | head -n 1)
arch=$(dpkg --print-architecture)
stage=$(mktemp -d)
chmod 0755 "$stage"
trap 'rm -rf "$stage"' EXIT INT TERM

install -d -m 0755 "$stage/DEBIAN" "$stage/usr/bin" "$stage/usr/lib/rtprof" \
    "$stage/lib/systemd/system" "$stage/etc/rtprof" "$stage/usr/share/doc/rtprof"

# Debug sections out (the symbol tables stay, for backtraces): the release
# profile keeps line tables, which would make the package several times
# larger.
install -m 0755 "$build/rtprof" "$build/rtprofd" "$stage/usr/bin/"
install -m 0644 "$build/librtprof.so" "$stage/usr/lib/rtprof/"
strip --strip-debug "$stage/usr/bin/rtprof" "$stage/usr/bin/rtprofd" \
    "$stage/usr/lib/rtprof/librtprof.so"

# The repository's unit, starting the packaged rtprofd; its comment says
# how to install it by hand, which the package does instead.
{
    echo "# rtprofd, from the rtprof package. \`rtprof system enable\` enables and starts it."
    sed -e '/^#/d' -e 's|/usr/local/bin/rtprofd|/usr/bin/rtprofd|' "$repo/daemon/rtprofd.service"
} > "$stage/lib/systemd/system/rtprofd.service"
chmod 0644 "$stage/lib/systemd/system/rtprofd.service"

install -m 0644 "$here/rtprof.conf" "$stage/etc/rtprof/rtprof.conf"
install -m 0644 "$here/copyright" "$stage/usr/share/doc/rtprof/copyright"
gzip -9n < "$repo/README.md" > "$stage/usr/share/doc/rtprof/README.md.gz"
chmod 0644 "$stage/usr/share/doc/rtprof/README.md.gz"
install -d -m 0755 "$stage/usr/share/doc/rtprof/docs"
for page in "$repo"/docs/*.md; do
    gzip -9n < "$page" > "$stage/usr/share/doc/rtprof/docs/$(basename "$page").gz"
    chmod 0644 "$stage/usr/share/doc/rtprof/docs/$(basename "$page").gz"
done

for script in postinst prerm postrm; do
    install -m 0755 "$here/$script" "$stage/DEBIAN/$script"
done
echo /etc/rtprof/rtprof.conf > "$stage/DEBIAN/conffiles"

# The newest glibc symbol version any of the three needs.
glibc=$(objdump -T "$stage/usr/bin/rtprof" "$stage/usr/bin/rtprofd" \
    "$stage/usr/lib/rtprof/librtprof.so" | grep -o 'GLIBC_[0-9.]*' |
    sed 's/GLIBC_//' | sort -V | tail -n 1)
size=$(du -sk --exclude=DEBIAN "$stage" | cut -f 1)
cat > "$stage/DEBIAN/control" <<CONTROL
Package: rtprof
Version: $version
Architecture: $arch
Maintainer: ${DEBFULLNAME:-rtprof developers} <${DEBEMAIL:-rtprof@localhost}>
Installed-Size: $size
Depends: libc6 (>= $glibc), libgcc-s1
Section: devel
Priority: optional
Description: exact call counts for every function of running programs
 rtprof counts every call of every function of a program, without
 recompiling it, and samples where its time goes. The agent
 (/usr/lib/rtprof/librtprof.so) is preloaded into a program with
 "rtprof run", or into every new process on the machine with
 "rtprof system enable" (through /etc/ld.so.preload; "rtprof system
 disable" undoes it). rtprofd follows every profiled process and publishes
 per-span statistics for "rtprof top", "rtprof report" and Prometheus.
CONTROL

mkdir -p "$out"
deb="$out/rtprof_${version}_${arch}.deb"
dpkg-deb --root-owner-group --build "$stage" "$deb" >/dev/null
echo "$deb"
