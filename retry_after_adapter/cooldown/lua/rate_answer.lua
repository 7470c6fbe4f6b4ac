-- An answer for the learned rate (rate.answer_rate), atomically. Loaded after rate.lua.
-- KEYS = the rate hash; ARGV = the attempt's epoch (-1: the current one), the cooldown
-- it announced (epoch ms, -1: a good answer), now (epoch ms), how long (ms) a rate is
-- kept past its window.
local r = rate_load(KEYS[1])
if r == nil then return 0 end
local epoch = tonumber(ARGV[1])
local untilms = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
rate_roll(r, now)
if epoch < 0 then epoch = r.ep end
if untilms < 0 then
  if epoch == r.ep and rate_cold(r) then
    r.ok = r.ok + 1
    r.gr = r.gr + 1
    if r.cap < RATE_SLOW_START_CAP or r.gr >= r.cap then
      r.cap = r.cap + 1
      r.gr = 0
    end
    if r.cap >= RATE_OPEN_CAP then r.cap = 0 end
  elseif epoch == r.gc and r.gc == r.ep - 1 and r.lim < RATE_MAX_COUNT then
    r.lim = r.lim + 1
    if r.lim > r.ceil then r.ceil = r.lim end
  else
    return 0
  end
elseif epoch ~= r.ep then
  return 0
else
  local win = math.min(math.max(untilms - r.st, RATE_MIN_WINDOW), RATE_MAX_WINDOW)
  local start = math.max(untilms, now)
  if rate_cold(r) and r.ok <= 0 then
    r.cap, r.lim, r.win, r.gc = 1, 0, 0, -1
  elseif rate_cold(r) then
    local lim = math.max(1, math.min(r.ok, RATE_MAX_COUNT))
    r.cap, r.lim, r.win, r.ceil, r.gc = 0, lim, win, lim, epoch
  elseif r.lim <= 0 then
    r.cap, r.lim, r.win, r.gc = 1, 0, 0, -1
  elseif math.min(math.max(untilms - (r.st - r.gr * r.win), RATE_MIN_WINDOW), RATE_MAX_WINDOW) > r.win then
    r.cap, r.win, r.gc = 0, math.min(math.max(untilms - (r.st - r.gr * r.win), RATE_MIN_WINDOW), RATE_MAX_WINDOW), -1
  else
    r.cap, r.lim, r.gc = 0, math.max(1, math.floor(r.lim * RATE_BETA)), -1
  end
  r.ep, r.st, r.ok, r.gr = epoch + 1, start, 0, 0
end
rate_save(KEYS[1], r, tonumber(ARGV[4]))
return 1
