-- Builds some data at load, then asks the host to close and reopen its state every
-- fifth request: states are closed while the agent profiles them.
local data = {}
for i = 1, 5000 do data[i] = {i, tostring(i)} end
local calls = 0
function handle(n)
  calls = calls + 1
  local s = 0
  for i = 1, n do s = s + data[i % #data + 1][1] end
  if calls % 5 == 0 then return "close" end
  return s
end
