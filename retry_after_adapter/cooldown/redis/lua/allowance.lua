-- The allowance rules of allowance.py in Lua, loaded before admit.lua and allow.lua.
-- The hash has r (left), a (as of admission), u (until, epoch ms, written as a whole
-- number: '%d'), n (admitted), l (limit, 0: unknown), w (window ms, 0: unknown)
-- and x ("1": exact; w < 0: a bucket, a unit every -w ms). roll starts the server's
-- next window past the reset, or refills a bucket.
local function load(key)
  local h = redis.call('HMGET', key, 'r', 'a', 'u', 'n', 'l', 'w', 'x')
  if h[4] == false then return nil end
  return {r = tonumber(h[1]), a = tonumber(h[2]), u = tonumber(h[3]), n = tonumber(h[4]),
          l = tonumber(h[5]) or 0, w = tonumber(h[6]) or 0, x = h[7] == '1'}
end
local function save(key, rec, kept)
  redis.call('HSET', key, 'r', rec.r, 'a', rec.a, 'u', string.format('%d', rec.u), 'n', rec.n,
             'l', rec.l, 'w', rec.w, 'x', rec.x and '1' or '0')
  redis.call('PEXPIREAT', key, rec.u + kept)
end
local function roll(rec, now)
  if rec.u > now or rec.l <= 0 then return false end
  if rec.w < 0 then
    -- A bucket (allowance._refill): a unit each -w ms since u, up to l in all; past
    -- that, one probe a step.
    local periods = math.floor((now - rec.u) / -rec.w) + 1
    local room = rec.l - rec.r
    if room > 0 then rec.r = math.min(rec.l, rec.r + periods) end
    if periods > room then rec.r = math.max(rec.r, rec.n - rec.a + 1) end
    rec.u = rec.u + periods * -rec.w
    return true
  end
  if rec.w <= 0 then
    if rec.x then return false end
    rec.r = rec.l
    rec.a = rec.n
    rec.x = true
    return true
  end
  local periods = math.floor((now - rec.u) / rec.w) + 1
  rec.u = rec.u + periods * rec.w
  rec.r = rec.l
  rec.a = rec.n
  rec.x = true
  return true
end
