-- The learned rate's rules of rate.py in Lua (times in epoch ms), loaded before
-- admit.lua and rate_answer.lua. The hash has cap, lim, win (ms), ep, st (ms), base (ms),
-- sn, ok, gr, gc, qt, pr and fl: the fields of rate.Rate, in that order.
local RATE_SLOW_START_CAP = 4
local RATE_OPEN_CAP = 32
local RATE_BETA = 0.7
local RATE_MIN_WINDOW = 1000
local RATE_RESET_ROUNDING = 1000
local RATE_QUIET_HELD = 2
local RATE_QUIET_MOVED = 1
local RATE_BACKOFF = 1000
local RATE_MAX_BACKOFF = 20000
local RATE_PROBE_RECHECK = 1000
local RATE_OPEN_KEPT = 86400000
local RATE_MAX_WINDOW = 315360000000
local RATE_MAX_COUNT = 2147483647
local RATE_FIELDS = {'cap', 'lim', 'win', 'ep', 'st', 'base', 'sn', 'ok', 'gr', 'gc', 'qt', 'pr', 'fl'}
local function rate_load(key)
  local h = redis.call('HMGET', key, unpack(RATE_FIELDS))
  if h[1] == false then return nil end
  local r = {}
  for i, name in ipairs(RATE_FIELDS) do r[name] = tonumber(h[i]) or 0 end
  return r
end
local function rate_open(r)
  return r.cap <= 0 and r.lim <= 0
end
local function rate_save(key, r, kept)
  local args = {}
  for _, name in ipairs(RATE_FIELDS) do
    args[#args + 1] = name
    args[#args + 1] = string.format('%d', r[name])
  end
  redis.call('HSET', key, unpack(args))
  if rate_open(r) then kept = RATE_OPEN_KEPT end  -- its admissions write nothing (rate.OPEN_KEPT)
  redis.call('PEXPIREAT', key, r.st + r.win + kept)
end
local function rate_fresh(now)
  return {cap = 1, lim = 0, win = 0, ep = 0, st = now, base = now, sn = 0, ok = 0, gr = 0, gc = -1, qt = 0,
          pr = 0, fl = 0}
end
-- Each whole window passed without a throttle ends an epoch: the probes accepted raise
-- the limit (rate.roll_rate). Returns true when the record changed.
local function rate_roll(r, now)
  if r.lim <= 0 or r.win <= 0 or now < r.st + r.win then return false end
  local windows = math.floor((now - r.st) / r.win)
  r.lim = math.min(RATE_MAX_COUNT, r.lim + r.ok)
  r.ep = r.ep + windows
  r.st = r.st + windows * r.win
  r.sn = 0
  r.ok = 0
  r.qt = math.max(0, r.qt - windows)
  r.pr = 0
  r.fl = 0
  return true
end
