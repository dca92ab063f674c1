-- Isolate "beta": only work_beta and its helpers run here.
local t = {}
function work_beta(n)
  local s = 0
  for i = 1, n do s = s + (i % 7) end
  for i = 1, 64 do t[i] = {s, i} end
  return s
end
function handle(n) local r = work_beta(n); return r end
