-- A CPU-bound request: recursive calls, table building and sorting, string formatting.
local function fib(n)
  if n < 2 then return n end
  return fib(n - 1) + fib(n - 2)
end

local function shuffle_sort(n)
  local t = {}
  local x = 12345
  for i = 1, n do
    x = (x * 1103515245 + 12345) % 2147483648
    t[i] = x
  end
  table.sort(t)
  return t[1]
end

local function render(n)
  local parts = {}
  for i = 1, n do parts[#parts + 1] = string.format("%d:%x", i, i * 7) end
  return #table.concat(parts, ",")
end

function handle(n)
  local r = fib(n) + shuffle_sort(n * 20) + render(n * 5)
  return r
end
