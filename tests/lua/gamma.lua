-- Isolate "gamma": only work_gamma and its helpers run here.
local t = {}
function work_gamma(n)
  local s = 0
  for i = 1, n do s = s + (i % 7) end
  for i = 1, 64 do t[i] = {s, i} end
  return s
end
function handle(n) local r = work_gamma(n); return r end
