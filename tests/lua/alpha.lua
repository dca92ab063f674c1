-- Isolate "alpha": only work_alpha and its helpers run here.
local t = {}
function work_alpha(n)
  local s = 0
  for i = 1, n do s = s + (i % 7) end
  for i = 1, 64 do t[i] = {s, i} end
  return s
end
function handle(n) local r = work_alpha(n); return r end
