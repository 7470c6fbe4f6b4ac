-- allowance.merge_allowance in Lua. Loaded after allowance.lua.
-- KEYS[1] = the allowance hash; ARGV = remaining, until, now (epoch ms), the answered
-- attempt's admission number (-1: none), the limit and the window (ms; 0: not said),
-- the same-window tolerance and how long a record outlives its reset (ms), then the
-- change channel (empty: none) and the scope: a scope's first allowance is published,
-- before it is written,
-- there as "a 0 <scope>" (its admissions are counted by the store from then on).
local remaining = math.max(0, tonumber(ARGV[1]))
local untl, now, seq = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local lim, win, same, kept = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
if untl <= now then return 0 end
local rec = load(KEYS[1])
if win < 0 then
  -- A bucket's answer (allowance._merge_bucket): it replaces the record only when it
  -- leaves fewer; else the record stays as it is.
  if lim <= 0 then return 0 end
  local count = 0
  if rec ~= nil then count = rec.n end
  local at = count
  if seq >= 0 then at = math.min(seq + 1, count) end
  local left = math.min(remaining, lim)
  if rec ~= nil and rec.w < 0 then
    local rolled = roll(rec, now)
    if left - (count - at) >= rec.r - (rec.n - rec.a) then
      if rolled then save(KEYS[1], rec, kept) end
      return 1
    end
  end
  if rec == nil and ARGV[9] ~= nil and ARGV[9] ~= '' then
    redis.call('PUBLISH', ARGV[9], 'a 0 ' .. ARGV[10])  -- before the write (see extend.lua)
  end
  save(KEYS[1], {r = left, a = at, u = untl, n = count, l = lim, w = win, x = false}, kept)
  return 1
end
if rec ~= nil and rec.w < 0 then
  -- A bucket read before: this answer reads the limit as a window (a new record, the
  -- admissions still counted).
  rec = {r = 0, a = rec.n, u = 0, n = rec.n, l = 0, w = 0, x = false}
end
if rec ~= nil then
  if lim <= 0 then lim = rec.l end
  if win <= 0 then win = rec.w end
  local gap = untl - rec.u
  if win <= 0 and gap > same and now - rec.u < gap / 2 then win = math.floor(gap / 1000 + 0.5) * 1000 end
  roll(rec, now)
end
local count = 0
if rec ~= nil then count = rec.n end
local at = count
if seq >= 0 then at = math.min(seq + 1, count) end
if rec ~= nil and rec.u <= now and rec.x and lim > 0 then
  local left = math.min(remaining, rec.r - (rec.n - rec.a))
  save(KEYS[1], {r = left, a = count, u = untl, n = count, l = lim, w = win, x = true}, kept)
  return 1
end
if rec == nil or rec.u <= now then
  if rec == nil and ARGV[9] ~= nil and ARGV[9] ~= '' then
    redis.call('PUBLISH', ARGV[9], 'a 0 ' .. ARGV[10])  -- before the write (see extend.lua)
  end
  save(KEYS[1], {r = remaining, a = at, u = untl, n = count, l = lim, w = win, x = false}, kept)
  return 1
end
local gap = untl - rec.u
if gap > same then
  save(KEYS[1], {r = remaining, a = at, u = untl, n = count, l = lim, w = win, x = false}, kept)
  return 1
end
if gap < -same then return 0 end
if untl < rec.u then rec.u = untl end
rec.l = lim
rec.w = win
if lim > 0 then at = count end
if not rec.x and remaining - (count - at) < rec.r - (rec.n - rec.a) then
  rec.r = remaining
  rec.a = at
end
save(KEYS[1], rec, kept)
return 1
