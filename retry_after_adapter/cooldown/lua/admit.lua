-- Admission for one attempt, atomically, all or nothing (MemoryCooldownStore.admit).
-- Loaded after allowance.lua and rate.lua.
-- KEYS = the cooldown key, the quota's permit set, the allowance hash, the lease set,
-- all in one cluster slot; ARGV = now (ms, rounded down; the client's clock: cooldowns
-- are stamped so), how long a permit counts from it (ms, 0: no quota; a millisecond
-- more when now was rounded down, so never less than from the grant), the limit, a
-- unique member, "1" to read the cooldown from KEYS[1] ("0": the caller read it), how
-- long (ms) an allowance outlives its reset, the slots (0: no cap), the lease's ttl
-- (ms) and its token, then the batch (permits asked for, 1: one) and the hold (ms) of
-- the extra ones, then "1" to admit by the learned rate (KEYS[5] its hash, KEYS[6] its
-- permit set) with a cold slot's ttl (ms) and token, and how long (ms) a rate is kept
-- past its window.
-- Returns {cooldown or -1, -1 when admitted or when to ask again, the admission number
-- or -1, 1 when only a slot was missing, when the permit taken stops counting or -1,
-- the extra permits taken (each counting hold ms longer), the extra admissions of the
-- announced allowance counted (numbered after this one's), and its reset or -1}; by
-- the learned rate, three more: its epoch, 1 when a good answer is to be told, 1 when
-- the slot was taken as the cold slot's token.

-- One quota's permits on a permit set (a sorted set, score = when a permit stops
-- counting: its grant + per + margin, epoch ms): drops the permits that stopped
-- counting; -1 when fewer than the limit remain (one is taken when take is true; the
-- key lives as long as its last permit), else when one will be free.
local function take_permit(key, now, counts, limit, member, take)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  local count = redis.call('ZCARD', key)
  if count >= limit then
    local edge = redis.call('ZRANGE', key, count - limit, count - limit, 'WITHSCORES')
    return tonumber(edge[2])
  end
  if take then
    redis.call('ZADD', key, now + counts, member)
    local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    redis.call('PEXPIREAT', key, tonumber(last[2]) + 1000)
  end
  return -1
end
local now = tonumber(ARGV[1])
local cooldown = -1
if ARGV[5] == '1' then
  local stored = tonumber(redis.call('GET', KEYS[1]))
  if stored ~= nil then
    if stored > now then return {stored, stored, -1, 0, -1, 0, 0, -1} end
    cooldown = stored
  end
end
local rec = load(KEYS[3])
if rec ~= nil then
  local rolled = roll(rec, now)
  if rec.u > now and rec.r - (rec.n - rec.a) <= 0 then
    if rolled then save(KEYS[3], rec, tonumber(ARGV[6])) end
    return {cooldown, rec.u, -1, 0, -1, 0, 0, -1}
  end
end
local counts = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local pkey, member = KEYS[2], ARGV[4]
local slots, ttl, token = tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9]
local r, cold = nil, 0
if ARGV[12] == '1' and counts == 0 and rec == nil then
  -- The learned rate (rate.py): made at the scope's first admission, rolled, kept; it
  -- gives the permit (its limit per window, on its own permit set) and the slot (its
  -- cold cap, under a configured one too) that the steps below take.
  r = rate_load(KEYS[5])
  if r == nil then
    r = {cap = 1, lim = 0, win = 0, ceil = 0, ep = 0, st = now, ok = 0, gr = 0, gc = -1}
  else
    rate_roll(r, now)
  end
  rate_save(KEYS[5], r, tonumber(ARGV[15]))
  if r.cap > 0 then
    if slots > 0 then
      slots = math.min(slots, r.cap)
    else
      slots, ttl, token, cold = r.cap, tonumber(ARGV[13]), ARGV[14], 1
    end
  end
  if r.lim > 0 then
    counts, limit, pkey, member = r.win + 50, r.lim, KEYS[6], ARGV[14]
  end
end
if counts > 0 then
  local refused = take_permit(pkey, now, counts, limit, member, false)
  if refused >= 0 then return {cooldown, refused, -1, 0, -1, 0, 0, -1} end
end
if slots > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
  if redis.call('ZCARD', KEYS[4]) >= slots then
    local first = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
    return {cooldown, tonumber(first[2]), -1, 1, -1, 0, 0, -1}
  end
  redis.call('ZADD', KEYS[4], now + ttl, token)
  -- The set lives a second past this lease, never less than it did: a longer lease of
  -- another worker (another lease_ttl) keeps its time.
  if redis.call('PTTL', KEYS[4]) < ttl + 1000 then
    redis.call('PEXPIRE', KEYS[4], ttl + 1000)
  end
end
if r ~= nil then
  local permit = -1
  if counts > 0 then
    take_permit(pkey, now, counts, limit, member, true)
    permit = now + counts
  end
  local report = 0
  if rate_reports(r) then report = 1 end
  return {cooldown, -1, -1, 0, permit, 0, 0, -1, r.ep, report, cold}
end
local permit = -1
local extra = 0
if counts > 0 then
  take_permit(KEYS[2], now, counts, limit, ARGV[4], true)
  permit = now + counts
  local batch = tonumber(ARGV[10])
  if batch > 1 then
    -- Extra permits from the headroom only (base.extra_permits): the free ones before
    -- this attempt's, less a quarter of the limit.
    local free = limit - redis.call('ZCARD', KEYS[2]) + 1
    extra = math.max(0, math.min(batch - 1, free - 1 - math.floor(limit / 4)))
    local later = permit + tonumber(ARGV[11])
    for i = 1, extra do
      redis.call('ZADD', KEYS[2], later, ARGV[4] .. ':' .. i)
    end
    if extra > 0 then redis.call('PEXPIREAT', KEYS[2], later + 1000) end
  end
end
if rec == nil then return {cooldown, -1, -1, 0, permit, extra, 0, -1} end
local seq = rec.n
rec.n = rec.n + 1
-- More admissions of the announced allowance for the batch, before the reset and from
-- the headroom only (allowance.admit_more, allowance_reserve).
local units = 0
local batch = tonumber(ARGV[10])
if batch > 1 and rec.u > now then
  local base = rec.l
  if base <= 0 then base = rec.r end
  units = math.max(0, math.min(batch - 1, rec.r - (rec.n - rec.a) - math.floor(base / 4)))
  rec.n = rec.n + units
end
save(KEYS[3], rec, tonumber(ARGV[6]))
return {cooldown, -1, seq, 0, permit, extra, units, rec.u}
