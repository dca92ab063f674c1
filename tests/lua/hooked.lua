-- A script with its own debug hook: the adapter never replaces it, so CPU samples cannot
-- get Lua frames; its CPU time must still reach each window.
local calls = 0
function handle(ms)
  debug.sethook(function() calls = calls + 1 end, "", 100000)
  local y, stop = 0, os.clock() + ms / 1000
  repeat
    for i = 1, 1000 do y = (y * 31 + i) % 1000003 end
  until os.clock() >= stop
  debug.sethook()
  return y
end
