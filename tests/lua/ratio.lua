-- Two functions burning CPU 3:1 per request (same loop, 3x the iterations).
local function spin(n)
  local x = 0
  for i = 1, n do x = (x * 31 + i) % 1000003 end
  return x
end

-- no tail calls: Lua drops the frame of a function that ends in one
function burn_a(n) local r = spin(3 * n); return r end
function burn_b(n) local r = spin(n); return r end

function handle(n)
  local r = burn_a(n) + burn_b(n)
  return r
end
