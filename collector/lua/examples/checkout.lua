-- Demo isolate "checkout": prices a cart (table work, string keys, a price cache that
-- grows while the script loads).
local catalog = {}
for i = 1, 50000 do
  catalog["sku-" .. i] = {price = (i * 37) % 1000 + 99, tax = (i % 3) * 5}
end

local function line_total(item, qty)
  local p = catalog[item]
  return qty * p.price * (100 + p.tax) // 100
end

local function price_cart(n)
  local total = 0
  for i = 1, n do
    total = total + line_total("sku-" .. ((i * 7919) % 50000 + 1), i % 5 + 1)
  end
  return total
end

local function apply_coupons(total, n)
  local codes = {}
  for i = 1, n // 10 do codes[#codes + 1] = string.format("C%05d", i) end
  table.sort(codes, function(a, b) return a > b end)
  return total - #codes
end

function handle(n)
  local t = price_cart(n)
  local r = apply_coupons(t, n)
  return r
end
