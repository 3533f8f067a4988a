# A repository built, changed, inspected and repacked with fixed identities
# and dates, so every hash is the same from run to run.
set -eu
git init -q -b main repo
cd repo
git config core.autocrlf false
for i in 1 2 3 4 5 6; do
    seq 1 $((i * 300)) > "file$i.txt"
    git add "file$i.txt"
    git commit -q -m "add file$i"
done
sed -i 's/^5$/five/; s/^77$/seventy-seven/' file1.txt file3.txt
git diff --stat
git diff file1.txt
git commit -q -a -m "edit numbers"
git checkout -q -b side HEAD~2
echo side > side.txt
git add side.txt
git commit -q -m "side work"
git checkout -q main
git merge -q --no-edit side
git log --graph --format='%h %an %ad %s' --date=iso
git diff --numstat HEAD~3 HEAD
git gc -q
git count-objects -v | grep -v size
git fsck --no-progress --full
git rev-parse HEAD
git status --short --branch
echo "all steps done"
