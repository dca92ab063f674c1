-- CPU spent inside a long C call (table.sort without a Lua comparator: no Lua instruction
-- runs, so the hook waits for it to return) against the same CPU time spent in Lua code.
local N = 100000
local src = {}
local x = 1
for i = 1, N do x = (x * 1103515245 + 12345) % 2147483648; src[i] = x end

function sort_big()
  local t = table.move(src, 1, N, 1, {})
  table.sort(t)
  return t[1]
end

function spin_for(secs)
  local y, stop = 0, os.clock() + secs
  repeat
    for i = 1, 1000 do y = (y * 31 + i) % 1000003 end
  until os.clock() >= stop
  return y
end

function handle(n)
  local t0 = os.clock()
  sort_big()
  local r = spin_for(os.clock() - t0)
  return r
end
