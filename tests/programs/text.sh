# sort, awk, sed, grep, find and tar over generated data; tar with fixed
# owner, mode order and mtime so the archive is byte-identical.
set -eu
awk 'BEGIN { srand(7); for (i = 0; i < 20000; i++) printf "%d %s %d\n", int(rand() * 100000), substr("abcdefghij", int(rand() * 10) + 1, 3), i }' > nums.txt
sort -n nums.txt | head -n 5
sort -k2,2 -k1,1n nums.txt | tail -n 3
cut -d' ' -f2 nums.txt | sort | uniq -c | sort -k1,1nr -k2 | head -n 5
awk '{ s[$2] += $1 } END { for (k in s) print k, s[k] }' nums.txt | sort
sed -n 's/^\([0-9]*\)7 \(abc\) .*/\2:\1/p' nums.txt | sort -t: -k2,2n | head -n 4
grep -cE '^[0-9]{5} (bcd|efg) ' nums.txt
grep -n 'hij 1999[0-9]$' nums.txt || true
mkdir -p tree/a/b tree/c
for i in 1 2 3 4 5 6 7 8 9; do split -n "$i/9" nums.txt > "tree/$((i % 3 == 0 ? 1 : 0))$i.part"; done
mv tree/*3.part tree/a/; mv tree/*6.part tree/a/b/; mv tree/*9.part tree/c/
find tree -type f -name '*.part' -size +10k | sort
find tree -type d | sort
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=2020-01-01T00:00:00Z -cf tree.tar tree
sha256sum tree.tar
tar -tvf tree.tar | awk '{ print $1, $3, $6 }'
mkdir out && tar -xf tree.tar -C out && diff -r tree out/tree && echo "tar round trip ok"
echo "all steps done"
