-- Builds a table of 2^21 integers (an array part of 32 MiB) while the script loads and
-- keeps it for the life of the state.
local function build_table()
  local t = {}
  for i = 1, 2 * 1024 * 1024 do t[i] = i end
  return t
end
kept = build_table()

function handle(n)
  local s = 0
  for i = 1, n do s = s + kept[i] end
  return s
end
