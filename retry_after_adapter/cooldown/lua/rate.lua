-- The learned rate's rules of rate.py in Lua (times in epoch ms), loaded before
-- admit.lua and rate_answer.lua. The hash has cap, lim, win (ms), ceil, ep, st (ms),
-- ok, gr and gc: the fields of rate.Rate, in that order.
local RATE_SLOW_START_CAP = 4
local RATE_OPEN_CAP = 32
local RATE_BETA = 0.7
local RATE_KEPT_MS = 3600000
local RATE_MIN_WINDOW = 1000
local RATE_MAX_WINDOW = 315360000000
local RATE_MAX_COUNT = 2147483647
local function rate_load(key)
  local h = redis.call('HMGET', key, 'cap', 'lim', 'win', 'ceil', 'ep', 'st', 'ok', 'gr', 'gc')
  if h[1] == false then return nil end
  return {cap = tonumber(h[1]), lim = tonumber(h[2]), win = tonumber(h[3]), ceil = tonumber(h[4]),
          ep = tonumber(h[5]), st = tonumber(h[6]), ok = tonumber(h[7]), gr = tonumber(h[8]),
          gc = tonumber(h[9])}
end
local function rate_save(key, r, kept)
  redis.call('HSET', key, 'cap', r.cap, 'lim', r.lim, 'win', string.format('%d', r.win),
             'ceil', r.ceil, 'ep', r.ep, 'st', string.format('%d', r.st), 'ok', r.ok, 'gr', r.gr,
             'gc', r.gc)
  redis.call('PEXPIREAT', key, r.st + r.win + kept)
end
local function rate_roll(r, now)
  if r.lim <= 0 or r.win <= 0 or now < r.st + r.win then return end
  local windows = math.floor((now - r.st) / r.win)
  if (r.gr + windows) * r.win >= RATE_KEPT_MS then
    -- Learned again from a cold start, an hour after the last throttle's end.
    r.cap, r.lim, r.win, r.ep, r.st, r.ok, r.gr, r.gc = 1, 0, 0, r.ep + windows, r.st + windows * r.win, 0, 0, -1
    return
  end
  local lim = r.lim
  for _ = 1, math.min(windows, 64) do
    if lim >= r.ceil then break end
    lim = math.min(r.ceil, lim + math.max(1, math.floor((r.ceil - lim + 1) / 2)))
  end
  r.lim = lim
  r.ep = r.ep + windows
  r.st = r.st + windows * r.win
  r.ok = 0
  r.gr = r.gr + windows
  r.gc = -1
end
local function rate_cold(r)
  return r.cap > 0 and r.lim == 0
end
local function rate_reports(r)
  return rate_cold(r)
end
