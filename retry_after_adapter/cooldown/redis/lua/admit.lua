-- Admission for one attempt, atomically, all or nothing (MemoryCooldownStore.admit).
-- Loaded after allowance.lua and rate.lua.
-- KEYS = the cooldown key, the quota's permit set, the allowance hash, the lease set,
-- the learned rate's hash, and the quota's open permits (a sorted set:
-- score = when the permit stops counting, member = "<grant + per + margin>:<member>"),
-- all in one cluster slot; ARGV = now (ms, rounded down; the client's clock: cooldowns
-- are stamped so), how long a permit counts from it (ms, 0: no quota; a millisecond
-- more when now was rounded down, so never less than from the grant), the limit, a
-- unique member, "1" to read the cooldown from KEYS[1] ("0": the caller read it), how
-- long (ms) an allowance outlives its reset, the slots (0: no cap), the lease's ttl
-- (ms) and its token, then the batch (permits asked for, 1: one) and the hold (ms) of
-- the extra ones, then "1" to admit by the learned rate (KEYS[5] its hash) with a probe
-- slot's ttl (ms) and token, and how long (ms) a rate is kept
-- past its window, then how much longer (ms) an open permit counts (0: not open) and
-- the quota's per (ms); then the attempt's cost in tokens (0: none), the token
-- quota's limit (0: none), how long (ms) a token permit counts from now and a unique
-- member for it: KEYS[7] is the scope's announced token allowance (a hash as KEYS[3])
-- and KEYS[8] the token quota's permits (a sorted set: score = when a permit stops
-- counting, member = "<member>:<cost>"). An attempt whose tokens are weighed is never
-- admitted by the learned rate; its grant's reply has four more numbers: -2 (not the
-- learned rate), the announced token allowance's count after its cost less one (-1:
-- none counted), 0 and when its token permit stops counting (-1: none). A cost above
-- the announced token allowance's whole limit is refused for good: two more numbers,
-- -3 and that limit (the wait is its reset, or now).
-- ARGV[22]: a reservation's latest time (ms; -1: none, see base.Reservations): a
-- reservation's reply is a grant's eight numbers, then -4 and the reserved time;
-- ARGV[23]: the end (ms) of a reservation held, given back first (-1: none);
-- ARGV[24]: the attempt's priority (base.Ask.priority); KEYS[9] the quota's
-- reservations' marks (base.Mark; a sorted set: score = the permit's stored end,
-- member = "<priority>:<place>:<w, waiting, or s, sent>:<member>").
-- Returns {cooldown or -1, -1 when admitted or when to ask again, the admission number
-- or -1, 1 when only a slot was missing, when the permit taken stops counting or -1,
-- the extra permits taken (each counting hold ms longer), the extra admissions of the
-- announced allowance counted (numbered after this one's), and its reset or -1}; by
-- the learned rate, three more: its epoch (or, refused, -1), 1 when a probe's good
-- answer is to be told, 1 when the slot was taken as the probe's token (a known send's
-- too, when probes follow it in its epoch).

-- base.RECHECK in ms: when a reservation's holder held back by an unanswered permit
-- asks again at the latest.
local RECHECK = 1000
-- base.PACE_UNDER in ms.
local PACE_UNDER = 10000

-- When a permit of a full permit set (count >= limit) is free at the earliest: once
-- count - limit + 1 stopped counting, an open permit counted as ending at its grant +
-- per + margin, or at floor (now + per) if later (base.free_at).
local function free_at(key, okey, now, count, limit, floor)
  local k = count - limit + 1
  local opened = {}
  if okey ~= nil then
    redis.call('ZREMRANGEBYSCORE', okey, '-inf', now)
    opened = redis.call('ZRANGE', okey, 0, -1, 'WITHSCORES')
  end
  if #opened == 0 then
    local edge = redis.call('ZRANGE', key, k - 1, k - 1, 'WITHSCORES')
    return tonumber(edge[2])
  end
  local skip, ends = {}, {}
  for i = 1, #opened, 2 do
    skip[opened[i + 1]] = (skip[opened[i + 1]] or 0) + 1
    ends[#ends + 1] = math.max(tonumber(string.match(opened[i], '^(%d+):')), floor)
  end
  local first = redis.call('ZRANGE', key, 0, k - 1 + #opened / 2, 'WITHSCORES')
  local closed = 0
  for i = 1, #first, 2 do
    if (skip[first[i + 1]] or 0) > 0 then
      skip[first[i + 1]] = skip[first[i + 1]] - 1
    elseif closed < k then
      closed = closed + 1
      ends[#ends + 1] = tonumber(first[i + 1])
    end
  end
  table.sort(ends)
  return ends[math.min(k, #ends)]
end

-- For a reservation of priority prio: when a permit is free at the earliest counting
-- no waiting reservation (wkey) of a lower priority (base.placing_ends, base.free_in):
-- nil when none is lower (the count unchanged), now when one is free now.
local function placed_free(key, okey, wkey, now, limit, prio, floor)
  local marks = redis.call('ZRANGE', wkey, 0, -1, 'WITHSCORES')
  local lower, any = {}, false
  for i = 1, #marks, 2 do
    local rank, flag = string.match(marks[i], '^(%-?%d+):%d+:(%a):')
    if flag == 'w' and tonumber(rank) < prio then
      lower[marks[i + 1]] = (lower[marks[i + 1]] or 0) + 1
      any = true
    end
  end
  if not any then return nil end
  local all = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
  local log, out = {}, {}
  for i = 2, #all, 2 do
    if (lower[all[i]] or 0) > 0 then
      lower[all[i]] = lower[all[i]] - 1
      out[all[i]] = (out[all[i]] or 0) + 1
    else
      log[#log + 1] = all[i]
    end
  end
  if #log < limit then return now end
  local k = #log - limit + 1
  local skip, ends = {}, {}
  local opened = redis.call('ZRANGE', okey, 0, -1, 'WITHSCORES')
  for i = 1, #opened, 2 do
    local e = opened[i + 1]
    if (out[e] or 0) > 0 then
      out[e] = out[e] - 1
    else
      skip[e] = (skip[e] or 0) + 1
      ends[#ends + 1] = math.max(tonumber(string.match(opened[i], '^(%d+):')), floor)
    end
  end
  if #ends == 0 then return tonumber(log[k]) end
  local closed = 0
  for _, e in ipairs(log) do
    if (skip[e] or 0) > 0 then
      skip[e] = skip[e] - 1
    elseif closed < k then
      closed = closed + 1
      ends[#ends + 1] = tonumber(e)
    end
  end
  table.sort(ends)
  return ends[math.min(k, #ends)]
end

-- A sorted set lives a second past its last member's score (ms): never less than its
-- longest entry (another worker's may count longer: another margin, hold or open).
local function past_last(key)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', key, tonumber(last[2]) + 1000)
end

-- One quota's permits on a permit set (a sorted set, score = when a permit stops
-- counting: its grant + per + margin, epoch ms): drops the permits that stopped
-- counting; -1 when fewer than the limit remain (one is taken when take is true; the
-- key lives as long as its last permit), else when one will be free.
local function take_permit(key, now, counts, limit, member, take, okey, floor)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  local count = redis.call('ZCARD', key)
  if count >= limit then
    return free_at(key, okey, now, count, limit, floor)
  end
  if take then
    redis.call('ZADD', key, now + counts, member)
    past_last(key)
  end
  return -1
end
-- A token quota's permits (KEYS[8]) at now: -1 when cost more tokens fit under the
-- limit, else when enough permits stop counting (weights.weighed_free_at).
local function weighed_refused(key, now, cost, limit)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  local all = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
  local costs, total = {}, 0
  for i = 1, #all, 2 do
    costs[i] = tonumber(string.match(all[i], ':(%d+)$')) or 0
    total = total + costs[i]
  end
  local excess = total + cost - limit
  if excess <= 0 then return -1 end
  for i = 1, #all, 2 do
    excess = excess - costs[i]
    if excess <= 0 then return tonumber(all[i + 1]) end
  end
  return tonumber(all[#all])
end
local now = tonumber(ARGV[1])
local cooldown = -1

if ARGV[5] == '1' then
  local stored = tonumber(redis.call('GET', KEYS[1]))
  if stored ~= nil then
    if stored > now then
      -- A reservation's holder refused by a cooldown: its place is moot, given back.
      local gone = tonumber(ARGV[23]) or -1
      if gone >= 0 and tonumber(ARGV[2]) > 0 then
        for _, k in ipairs({KEYS[2], KEYS[6]}) do
          local found = redis.call('ZRANGEBYSCORE', k, gone, gone, 'LIMIT', 0, 1)
          if #found > 0 then redis.call('ZREM', k, found[1]) end
        end
        for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[9], gone, gone)) do
          if string.match(m, '^%-?%d+:%d+:w:') then redis.call('ZREM', KEYS[9], m); break end
        end
      end
      return {stored, stored, -1, 0, -1, 0, 0, -1}
    end
    cooldown = stored
  end
end
local rec = load(KEYS[3])
if rec ~= nil then
  local rolled = roll(rec, now)
  local left = rec.r - (rec.n - rec.a)
  local spent = left <= 0
  if spent and rec.u > now then
    if rolled then save(KEYS[3], rec, tonumber(ARGV[6])) end
    local wait = rec.u
    -- A bucket (w < 0): when the units owed and the next have come back.
    if rec.w < 0 then wait = rec.u - left * -rec.w end
    return {cooldown, wait, -1, 0, -1, 0, 0, -1}
  end
  -- Past a reset whose next window's end is unknown, the limit admitted: wait up to
  -- allowance.AWAIT_ANSWER (1 s) past the reset for an answer to say it.
  if spent and rec.x and rec.w <= 0 and rec.l > 0 and rec.u + 1000 > now then
    if rolled then save(KEYS[3], rec, tonumber(ARGV[6])) end
    return {cooldown, rec.u + 1000, -1, 0, -1, 0, 0, -1}
  end
end
-- The attempt's tokens (weights.py): the announced token allowance, then the token
-- quota; nothing taken until every check passed.
local cost, tlimit = tonumber(ARGV[18]), tonumber(ARGV[19])
local trec = nil
if cost > 0 then
  trec = load(KEYS[7])
  if trec ~= nil and trec.l > 0 and cost > trec.l then
    -- Above the server's whole token limit: never admitted (weights.oversized).
    return {cooldown, math.max(trec.u, now), -1, 0, -1, 0, 0, -1, -3, trec.l}
  end
  if trec ~= nil then
    local trolled = roll(trec, now)
    local short = trec.r - (trec.n - trec.a) < cost
    local held = -1
    if short and trec.u > now then
      held = trec.u
    elseif short and trec.x and trec.w <= 0 and trec.l > 0 and trec.u + 1000 > now then
      held = trec.u + 1000
    end
    if held >= 0 then
      if trolled then save(KEYS[7], trec, tonumber(ARGV[6])) end
      return {cooldown, held, -1, 0, -1, 0, 0, -1}
    end
  end
  if tlimit > 0 then
    local refused = weighed_refused(KEYS[8], now, cost, tlimit)
    if refused >= 0 then return {cooldown, refused, -1, 0, -1, 0, 0, -1} end
  end
end
local weighs = cost > 0 and (trec ~= nil or tlimit > 0)
local counts = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local slots, ttl, token = tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9]
local opened, per = tonumber(ARGV[16]), tonumber(ARGV[17])
if ARGV[12] == '1' and counts == 0 and rec == nil and not weighs then
  -- The learned rate (rate.py): made at the scope's first admission, rolled, kept: a
  -- known send (one of its limit in the epoch; with probes to come, holding a probe
  -- slot until its answer), else a probe (a slot of its cap, under a configured one
  -- too: every known send's answered), else refused.
  local r = rate_load(KEYS[5])
  if r == nil then
    r = rate_fresh(now)
    rate_save(KEYS[5], r, tonumber(ARGV[15]))
  elseif rate_roll(r, now) then
    rate_save(KEYS[5], r, tonumber(ARGV[15]))
  end
  if r.st > now then return {cooldown, r.st, -1, 0, -1, 0, 0, -1, -1} end
  local known = r.sn < r.lim
  local probe = not rate_open(r) and not known
  local ends = -1
  if r.lim > 0 then ends = r.st + r.win end
  if probe and (r.cap <= 0 or r.qt > 0) then return {cooldown, ends, -1, 0, -1, 0, 0, -1, -1} end
  local cold, capped = 0, false
  if probe then
    if slots > 0 then
      capped = slots > r.cap
      slots = math.min(slots, r.cap)
    else
      slots, ttl, token, cold = r.cap, tonumber(ARGV[13]), ARGV[14], 1
    end
  end
  if slots > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
    if redis.call('ZCARD', KEYS[4]) >= slots then
      local first = tonumber(redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')[2])
      if probe and (capped or cold == 1) then
        if ends >= 0 and ends < first then first = ends end
        if now + RATE_PROBE_RECHECK < first then first = now + RATE_PROBE_RECHECK end
        return {cooldown, first, -1, 1, -1, 0, 0, -1, -1}
      end
      return {cooldown, first, -1, 1, -1, 0, 0, -1}
    end
    redis.call('ZADD', KEYS[4], now + ttl, token)
    if redis.call('PTTL', KEYS[4]) < ttl + 1000 then
      redis.call('PEXPIRE', KEYS[4], ttl + 1000)
    end
  end
  if rate_open(r) then return {cooldown, -1, -1, 0, -1, 0, 0, -1} end
  if known then
    redis.call('HINCRBY', KEYS[5], 'sn', 1)
    if slots == 0 and r.lim > 0 and r.cap > 0 and r.qt <= 0 then
      -- Probes follow in this epoch (rate.Rate.waits_for_known): this send holds a probe
      -- slot (never refused for it) until its answer, so no probe races it to the server.
      local held = tonumber(ARGV[13])
      redis.call('ZADD', KEYS[4], now + held, ARGV[14])
      if redis.call('PTTL', KEYS[4]) < held + 1000 then
        redis.call('PEXPIRE', KEYS[4], held + 1000)
      end
      return {cooldown, -1, -1, 0, -1, 0, 0, -1, r.ep, 0, 1}
    end
    return {cooldown, -1, -1, 0, -1, 0, 0, -1, r.ep, 0, 0}
  end
  if r.pr == 0 then
    r.pr = 1
    rate_save(KEYS[5], r, tonumber(ARGV[15]))
  end
  return {cooldown, -1, -1, 0, -1, 0, 0, -1, r.ep, 1, cold}
end
local held = tonumber(ARGV[23]) or -1
local prio = tonumber(ARGV[24]) or 0
if counts > 0 and held >= 0 then
  -- A reservation's holder asking at its time (base.Ask.held), its permit kept: it goes
  -- now while fewer than the limit others count (base.holder_ends), marked sent;
  -- else it is told when to ask again (the earliest counted could end; an unanswered
  -- one's within RECHECK ms), if no later than ARGV[22]; else its permit is given back
  -- and the admission decided again.
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now)
  redis.call('ZREMRANGEBYSCORE', KEYS[9], '-inf', now)
  local mine = redis.call('ZRANGEBYSCORE', KEYS[2], held, held, 'LIMIT', 0, 1)
  if #mine > 0 then
    local pending, own, expected = {}, nil, held
    local opened = redis.call('ZRANGE', KEYS[6], 0, -1, 'WITHSCORES')
    for i = 1, #opened, 2 do
      local stored = tonumber(opened[i + 1])
      local when = tonumber(string.match(opened[i], '^(%d+):'))
      if own == nil and stored == held then
        own, expected = opened[i], when
      else
        local list = pending[stored]
        if list == nil then list = {}; pending[stored] = list end
        list[#list + 1] = when
      end
    end
    local marks, mark = {}, nil
    local all_marks = redis.call('ZRANGE', KEYS[9], 0, -1, 'WITHSCORES')
    for i = 1, #all_marks, 2 do
      local stored = tonumber(all_marks[i + 1])
      local rank, place, flag = string.match(all_marks[i], '^(%-?%d+):(%d+):(%a):')
      local m = {rank = tonumber(rank), place = tonumber(place), sent = flag == 's', member = all_marks[i]}
      if stored == held and not m.sent and (mark == nil or m.rank == prio) then
        if mark ~= nil then
          local list = marks[stored]
          if list == nil then list = {}; marks[stored] = list end
          list[#list + 1] = mark
        end
        mark = m
      else
        local list = marks[stored]
        if list == nil then list = {}; marks[stored] = list end
        list[#list + 1] = m
      end
    end
    local rank, place = prio, held - counts
    if mark ~= nil then rank, place = mark.rank, mark.place end
    -- base.holder_ends: left out, as they count on it, a waiting one behind it, and
    -- unless overtaken one sent from a later place at its priority or a lower one and
    -- an unmarked open one granted after its place.
    local all = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
    -- A higher priority among them may have been placed leaving this one out: then
    -- what counted on this one may not be left out.
    local overtaken = false
    for i = 2, #all, 2 do
      for _, m in ipairs(marks[tonumber(all[i])] or {}) do
        if m.rank > rank then overtaken = true end
      end
    end
    local ends, skipped = {}, false
    for i = 1, #all, 2 do
      local stored = tonumber(all[i + 1])
      if stored == held and not skipped then
        skipped = true
      else
        local found, m = marks[stored], nil
        if found ~= nil and #found > 0 then m = table.remove(found) end
        local list = pending[stored]
        local when = nil
        if list ~= nil and #list > 0 then when = table.remove(list) end
        local out, late = false, 0
        if m ~= nil then
          if not m.sent then
            out = m.rank < rank or (m.rank == rank and m.place > place)
            -- Ahead of it and past its place: it goes no earlier than now.
            late = math.max(0, now - m.place)
          else
            out = m.rank <= rank and m.place > place and not overtaken
          end
        elseif when ~= nil then
          out = when > expected and not overtaken
        end
        if not out then
          if when == nil then
            ends[#ends + 1] = stored + late
          else
            ends[#ends + 1] = math.min(math.max(when + late, now + per), now + RECHECK)
          end
        end
      end
    end
    if #ends < limit then
      -- It goes now, later than its place: its permit counts from now, as one granted
      -- now would (the server counts it from its arrival), its open entry moved as much.
      -- Sent from its place: marked so, its mark moved with its end.
      if mark ~= nil then redis.call('ZREM', KEYS[9], mark.member) end
      local restamp = math.max(now + counts, held)
      redis.call('ZADD', KEYS[9], restamp, string.format('%d:%d:s:', rank, place) .. ARGV[4])
      past_last(KEYS[9])
      -- An open one is expected to end per + margin after now, as one granted now (not
      -- moved as much as its stored end: this ask may keep it open longer or shorter
      -- than the reservation did, a batch's OPEN_LIFE against an attempt's OPEN_FOR).
      local moved = math.max(expected, now + counts - tonumber(ARGV[16]))
      if restamp <= held then
        if own ~= nil and moved > expected then
          redis.call('ZREM', KEYS[6], own)
          redis.call('ZADD', KEYS[6], held, string.format('%d', moved) .. ':' .. string.match(own, '^%d+:(.*)$'))
          -- (a ZREM of its last member deleted the key: it lives past its last one again)
          past_last(KEYS[6])
        end
        return {cooldown, -1, -1, 0, held, 0, 0, -1}
      end
      redis.call('ZADD', KEYS[2], restamp, mine[1])
      past_last(KEYS[2])
      if own ~= nil then
        redis.call('ZREM', KEYS[6], own)
        redis.call('ZADD', KEYS[6], restamp, string.format('%d', moved) .. ':' .. string.match(own, '^%d+:(.*)$'))
        past_last(KEYS[6])
      end
      return {cooldown, -1, -1, 0, restamp, 0, 0, -1}
    end
    table.sort(ends)
    local again = ends[#ends - limit + 1]
    local by = tonumber(ARGV[22]) or -1
    if by < 0 or again <= by then return {cooldown, -1, -1, 0, held, 0, 0, -1, -4, again} end
    redis.call('ZREM', KEYS[2], mine[1])
    if own ~= nil then redis.call('ZREM', KEYS[6], own) end
    if mark ~= nil then redis.call('ZREM', KEYS[9], mark.member) end
  end
end
if counts > 0 then
  local refused = take_permit(KEYS[2], now, counts, limit, ARGV[4], false, KEYS[6], now + per)
  if refused >= 0 then
    -- A reservation (base.Reservations): the permit taken for when it is free, if that
    -- is no later than ARGV[22] and the quota alone refused (no slot, no tokens, no
    -- announced allowance); it counts from then, open as any permit of the quota.
    local by = tonumber(ARGV[22]) or -1
    if by < 0 or slots > 0 or rec ~= nil or weighs then
      return {cooldown, refused, -1, 0, -1, 0, 0, -1}
    end
    redis.call('ZREMRANGEBYSCORE', KEYS[9], '-inf', now)
    local free = placed_free(KEYS[2], KEYS[6], KEYS[9], now, limit, prio, now + per)
    if free ~= nil then refused = math.max(free, now) end
    -- A quota whose per is under base.PACE_UNDER: no earlier than per / limit after
    -- the latest place waiting at prio or higher (base.paced): permits freed in a
    -- burst are spent spread out.
    local marks = {}
    if per < PACE_UNDER then marks = redis.call('ZRANGE', KEYS[9], 0, -1) end
    for _, m in ipairs(marks) do
      local rank, place = string.match(m, '^(%-?%d+):(%d+):%a:')
      if tonumber(rank) >= prio then
        refused = math.max(refused, tonumber(place) + math.floor(per / limit))
      end
    end
    if refused > by then return {cooldown, refused, -1, 0, -1, 0, 0, -1} end
    local ends = refused + counts
    redis.call('ZADD', KEYS[2], ends, ARGV[4])
    past_last(KEYS[2])
    if opened > 0 then
      redis.call('ZADD', KEYS[6], ends, string.format('%d', ends - opened) .. ':' .. ARGV[4])
      past_last(KEYS[6])
    end
    -- Marked: waiting, or sent when granted at once (ahead of lower waiting ones).
    local flag = 'w'
    if refused <= now then flag = 's' end
    redis.call('ZADD', KEYS[9], ends, string.format('%d:%d:%s:', prio, refused, flag) .. ARGV[4])
    past_last(KEYS[9])
    if refused <= now then return {cooldown, -1, -1, 0, ends, 0, 0, -1} end
    return {cooldown, -1, -1, 0, ends, 0, 0, -1, -4, refused}
  end
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
local permit = -1
local extra = 0
if counts > 0 then
  take_permit(KEYS[2], now, counts, limit, ARGV[4], true)
  permit = now + counts
  if opened > 0 then
    -- An open permit: its grant + per + margin kept beside it, until it is settled.
    redis.call('ZADD', KEYS[6], permit, string.format('%d', permit - opened) .. ':' .. ARGV[4])
    past_last(KEYS[6])  -- its longest open permit
  end
  local batch = tonumber(ARGV[10])
  if batch > 1 then
    -- Extra permits from the headroom only (base.extra_permits): the free ones before
    -- this attempt's, less a quarter of the limit.
    local free = limit - redis.call('ZCARD', KEYS[2]) + 1
    extra = math.max(0, math.min(batch - 1, free - 1 - math.floor(limit / 4)))
    local later = permit + tonumber(ARGV[11])
    for i = 1, extra do
      redis.call('ZADD', KEYS[2], later, ARGV[4] .. ':' .. i)
      if opened > 0 then  -- open too: each settled by its own answer, or given back
        redis.call('ZADD', KEYS[6], later, string.format('%d', later - opened) .. ':' .. ARGV[4] .. ':' .. i)
      end
    end
    if extra > 0 and opened > 0 then
      past_last(KEYS[6])
    end
    if extra > 0 then
      -- The set lives a second past its longest permit (another worker's may count
      -- longer than this batch: another margin or hold).
      past_last(KEYS[2])
    end
  end
end
-- The grant's tokens.
local wend, tseq = -1, -1
if weighs then
  if trec ~= nil then
    trec.n = trec.n + cost
    tseq = trec.n - 1
    save(KEYS[7], trec, tonumber(ARGV[6]))
  end
  if tlimit > 0 then
    wend = now + tonumber(ARGV[20])
    redis.call('ZADD', KEYS[8], wend, ARGV[21] .. ':' .. cost)
    past_last(KEYS[8])
  end
end
local function granted(reply)
  if weighs then
    reply[9], reply[10], reply[11], reply[12] = -2, tseq, 0, wend
  end
  return reply
end
if rec == nil then return granted({cooldown, -1, -1, 0, permit, extra, 0, -1}) end
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
return granted({cooldown, -1, seq, 0, permit, extra, units, rec.u})
