-- Demo isolate "search": tokenizes documents and ranks them (string library heavy).
local docs = {}
local words = {"lua", "profile", "sample", "stack", "frame", "window", "isolate", "heap"}
for i = 1, 2000 do
  local t = {}
  for j = 1, 30 do t[j] = words[(i * j) % #words + 1] end
  docs[i] = table.concat(t, " ")
end

local function tokenize(s)
  local out = {}
  for w in s:gmatch("%a+") do out[#out + 1] = w end
  return out
end

local function score(doc, query)
  local s = 0
  for _, w in ipairs(tokenize(doc)) do
    if w == query then s = s + 1 end
  end
  return s
end

function handle(n)
  local q = words[n % #words + 1]
  local best, best_i = -1, 0
  for i = 1, n // 10 do
    local s = score(docs[i % #docs + 1], q)
    if s > best then best, best_i = s, i end
  end
  return best_i
end
