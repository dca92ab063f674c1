-- Every request fails one way or another: error(), a runtime error, an error object.
local calls = 0
function handle(n)
  calls = calls + 1
  local k = calls % 3
  if k == 0 then error("boom " .. calls) end
  if k == 1 then local t = nil; return t.field end
  error({code = calls})
end
