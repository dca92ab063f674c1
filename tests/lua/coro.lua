-- Coroutine-heavy: generators through wrap, producer/consumer through resume, nested
-- coroutines, errors inside coroutines, and coroutines left suspended.
local function gen_body(n)
  for i = 1, n do coroutine.yield(i * 2) end
end
local function producer(n)
  return coroutine.create(function()
    for i = 1, n do
      local inner = coroutine.wrap(function() for j = 1, 3 do coroutine.yield(i + j) end end)
      coroutine.yield(inner() + inner())
    end
  end)
end
local parked = {}
function handle(n)
  local s = 0
  for v in coroutine.wrap(function() gen_body(n) end) do s = s + v end
  local p = producer(n // 10)
  while true do
    local ok, v = coroutine.resume(p)
    if not ok or v == nil then break end
    s = s + v
  end
  local bad = coroutine.create(function() coroutine.yield(1); error("inside") end)
  coroutine.resume(bad); local ok = coroutine.resume(bad); assert(not ok)
  local ok2 = pcall(coroutine.wrap(function() error("wrapped") end)); assert(not ok2)
  parked[#parked % 50 + 1] = coroutine.create(function() coroutine.yield() end)
  coroutine.resume(parked[#parked])
  return s
end
