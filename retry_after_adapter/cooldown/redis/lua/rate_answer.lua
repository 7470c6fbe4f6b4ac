-- An answer for the learned rate (rate.answer_rate), atomically. Loaded after rate.lua.
-- KEYS = the rate hash; ARGV = the attempt's epoch (-1: the current one), the end of the
-- throttle's wait (epoch ms; -1: a probe's good answer; at or before now: no usable
-- wait, the backoff applies), now (epoch ms), how long (ms) a rate is kept past its
-- window, then the change channel (empty: none) and the scope: a rate that stops being
-- open is published there as "r 0 <scope>" (every near copy admits by it again); then
-- what the throttled attempt was: "1" a probe, "0" a known send, "" not said.
-- The window as the server's resets tell it (rate._window_from_resets): half-way to
-- their reading (one shorter than the window counts the resets' rounding in), unchanged
-- before two epochs since the last throttle or when the wait is longer than a window.
local function rate_window_from_resets(r, epoch, untilms, now)
  local windows = epoch - r.gc
  if r.gc < 0 or windows < 2 or untilms - now > r.win + RATE_RESET_ROUNDING then return r.win end
  local since = untilms - r.base
  local reading = since / windows
  if reading < r.win then reading = math.min(r.win, (since + RATE_RESET_ROUNDING) / windows) end
  local win = math.floor((r.win + reading) / 2 + 0.5)
  return math.min(math.max(win, RATE_MIN_WINDOW), RATE_MAX_WINDOW)
end
local r = rate_load(KEYS[1])
if r == nil then return 0 end
local epoch = tonumber(ARGV[1])
local untilms = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local was_open = rate_open(r)
local rolled = rate_roll(r, now)
if epoch < 0 then epoch = r.ep end
if untilms < 0 then
  if epoch > r.gc and r.cap > 0 then
    r.ok = math.min(RATE_MAX_COUNT, r.ok + 1)
    r.gr = r.gr + 1
    if r.cap < RATE_SLOW_START_CAP or r.gr >= r.cap then
      r.cap = r.cap + 1
      r.gr = 0
    end
    r.fl = 0
    if r.cap >= RATE_OPEN_CAP then
      r.cap, r.lim, r.win, r.ok, r.gr, r.qt, r.pr = 0, 0, 0, 0, 0, 0, 0
    end
  elseif epoch == r.gc and r.lim > 0 and epoch == r.ep - 1 then
    r.lim = math.min(RATE_MAX_COUNT, r.lim + 1)
    r.fl = 0
  else
    if rolled then rate_save(KEYS[1], r, tonumber(ARGV[4])) end
    return 0
  end
elseif epoch ~= r.ep then
  if rolled then rate_save(KEYS[1], r, tonumber(ARGV[4])) end
  return 0
else
  if untilms <= now then
    untilms = now + math.min(RATE_MAX_BACKOFF, RATE_BACKOFF * 2 ^ math.min(r.fl, 16))
  end
  untilms = math.min(untilms, now + RATE_MAX_WINDOW)
  local lim, win, quiet = r.lim, r.win, RATE_QUIET_MOVED
  if r.lim <= 0 then
    if r.cap <= 0 or r.ok <= 0 then
      lim, win, quiet = 0, 0, 0
    else
      lim = math.min(r.ok, RATE_MAX_COUNT)
      win = math.min(math.max(now - r.st, RATE_MIN_WINDOW), RATE_MAX_WINDOW)
      quiet = RATE_QUIET_MOVED
    end
  else
    if ARGV[7] == '0' and (r.ok > 0 or r.pr > 0) then
      -- A known send refused while the epoch's probes were taken or on their way.
      lim = math.max(1, math.min(RATE_MAX_COUNT, r.sn - 1 + r.ok))
      quiet = RATE_QUIET_HELD
      win = rate_window_from_resets(r, epoch, untilms, now)
    elseif r.ok > 0 and untilms - RATE_RESET_ROUNDING > r.st + r.win then
      lim = math.max(lim, math.min(RATE_MAX_COUNT, r.ok))
    elseif r.ok > 0 then
      lim = math.min(RATE_MAX_COUNT, r.lim + r.ok)
    elseif r.pr > 0 then
      quiet = RATE_QUIET_HELD
      win = rate_window_from_resets(r, epoch, untilms, now)
    elseif epoch - r.gc >= 2 and r.win < untilms - r.base and untilms - r.base <= 2 * r.win + RATE_RESET_ROUNDING then
      win = untilms - r.base
    else
      lim = math.max(1, math.floor(r.lim * RATE_BETA))
    end
  end
  r.cap, r.lim, r.win, r.ep, r.st, r.base, r.sn = 1, lim, win, epoch + 1, untilms, untilms, 0
  r.ok, r.gr, r.gc, r.qt, r.pr, r.fl = 0, 0, epoch, quiet, 0, r.fl + 1
end
if was_open and not rate_open(r) and ARGV[5] ~= nil and ARGV[5] ~= '' then
  redis.call('PUBLISH', ARGV[5], 'r 0 ' .. ARGV[6])  -- before the write (see extend.lua)
end
rate_save(KEYS[1], r, tonumber(ARGV[4]))
return 1
