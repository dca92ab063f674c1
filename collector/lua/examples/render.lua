-- Demo isolate "render": fills templates through a coroutine pipeline.
local template = "<li>{name}: {count} items at {price}</li>"

local function rows(n)
  return coroutine.wrap(function()
    for i = 1, n do
      coroutine.yield({name = "row" .. i, count = i % 17, price = i * 3})
    end
  end)
end

local function fill(row)
  local s = template:gsub("{(%w+)}", function(k) return tostring(row[k]) end)
  return s
end

function handle(n)
  local out = {}
  for row in rows(n // 5) do out[#out + 1] = fill(row) end
  return #table.concat(out)
end
