-- An interpreter workout: recursion, tables, strings, sorting, closures.
local n = tonumber(arg[1]) or 1

local function fib(k) if k < 2 then return k end return fib(k - 1) + fib(k - 2) end

local function tables(size)
  local t = {}
  for i = 1, size do t[i] = (i * 7919) % size end
  table.sort(t)
  local m = {}
  for i = 1, size do m["k" .. t[i]] = i end
  local s = 0
  for k, v in pairs(m) do s = s + #k + v end
  return s
end

local function strings(count)
  local parts = {}
  for i = 1, count do
    parts[#parts + 1] = string.format("%d:%s", i, string.rep("x", i % 13))
  end
  local joined = table.concat(parts, ",")
  local hits = 0
  for w in joined:gmatch("%d+:x+") do hits = hits + 1 end
  return hits + #joined:upper()
end

local function closures(count)
  local acc = 0
  local fs = {}
  for i = 1, 100 do fs[i] = function(x) return x * i + acc end end
  for i = 1, count do acc = (acc + fs[i % 100 + 1](i)) % 1000003 end
  return acc
end

local total = 0
for _ = 1, n do
  total = total + fib(24) + tables(60000) + strings(40000) + closures(300000)
end
print(total)
