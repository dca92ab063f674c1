-- Two functions burning CPU 3:1 per request: burn_a for 3*n microseconds of CPU time,
-- burn_b for n (run with one worker thread: os.clock is the process's CPU time). Each spin
-- overshoots its end by up to one round between clock reads, the same for both, which pulls
-- the ratio towards 1: rounds of 100 keep that near a microsecond (1000 took ~20 us).
local function spin(us)
  local x, stop = 0, os.clock() + us / 1e6
  repeat
    for i = 1, 100 do x = (x * 31 + i) % 1000003 end
  until os.clock() >= stop
  return x
end

-- no tail calls: Lua drops the frame of a function that ends in one
function burn_a(n) local r = spin(3 * n); return r end
function burn_b(n) local r = spin(n); return r end

function handle(n)
  local r = burn_a(n) + burn_b(n)
  return r
end
