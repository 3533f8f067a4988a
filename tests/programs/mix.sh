# Pipes, subshells, command substitution, process substitution, here
# documents, functions, a background job, traps and a non-zero exit.
set -u
square() { local n=$1; echo $((n * n)); }
trap 'echo "exit trap"' EXIT

seq 1 5000 | awk '{ s += $1 } END { print "sum", s }'
letters=$(printf '%s\n' delta alpha charlie bravo | sort | tr '\n' ' ')
echo "sorted: $letters"
( cd / && echo "subshell in $(pwd)"; exit 4 )
echo "subshell status $?"
for i in 1 2 3 4 5; do square "$i"; done | paste -sd' ' -
while read -r a b; do echo "$b $a"; done <<'END'
one 1
two 2
three 3
END
diff <(printf '1\n2\n3\n') <(printf '1\n3\n3\n')
echo "diff status $?"
{ sleep 0.05; echo "background done"; } &
wait $!
echo "wait status $?"
count=0
while [ $count -lt 200 ]; do count=$((count + 1)); done
echo "count $count"
echo "nested $(echo "$(echo inner | tr a-z A-Z)" | tr A-Z a-z)"
printf '%05d|%-6s|%x\n' 42 ab 255
echo "to stderr" >&2
exit 5
