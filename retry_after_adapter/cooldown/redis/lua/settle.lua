-- KEYS[1] = a quota's permit set, KEYS[2] = its open permits, KEYS[3] = its
-- reservations not yet used (admit.lua's KEYS[9]); ARGV[1] = the quota's per
-- (ms), then four arguments per settle, settled in that order: the answer's time (ms,
-- rounded up), the permit's stored expiry (ms), a member for it should it be gone and
-- "1" for an exact settle (an open permit's answer: its entry among the open permits
-- goes, and a reservation given back waits no more). Each such permit (any one with that expiry; put back if it expired meanwhile)
-- counts until at least the answer + per (exactly, earlier too, when exact); the key
-- lives as long as its last permit. Returns how many permits moved. (A settle is not to
-- be written twice: a batch's open permits share their expiry, and a second write would
-- move another one.)
local per = tonumber(ARGV[1])
local moved = 0
for i = 2, #ARGV, 4 do
  local new = tonumber(ARGV[i]) + per
  local old = tonumber(ARGV[i + 1])
  local exact = ARGV[i + 3] == '1'
  if exact then
    local open = redis.call('ZRANGEBYSCORE', KEYS[2], old, old, 'LIMIT', 0, 1)
    if #open > 0 then redis.call('ZREM', KEYS[2], open[1]) end
    if KEYS[3] ~= nil then
      -- base.settled_mark: a waiting mark whose place is after the answer (given back:
      -- it goes), else a sent one (answered: it moves with its permit's end).
      local answered, waiting, sent = tonumber(ARGV[i]), nil, nil
      for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], old, old)) do
        local place, flag = string.match(m, '^%-?%d+:(%d+):(%a):')
        if flag == 'w' and tonumber(place) > answered then waiting = m end
        if flag == 's' then sent = m end
      end
      if waiting ~= nil then redis.call('ZREM', KEYS[3], waiting)
      elseif sent ~= nil then redis.call('ZADD', KEYS[3], new, sent) end  -- moves with its end
    end
  end
  if new > old or (new < old and exact) then
    local found = redis.call('ZRANGEBYSCORE', KEYS[1], old, old, 'LIMIT', 0, 1)
    local member = ARGV[i + 2]
    if #found > 0 then member = found[1] end
    redis.call('ZADD', KEYS[1], new, member)
    moved = moved + 1
  end
end
if moved > 0 then
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', KEYS[1], tonumber(last[2]) + 1000)
end
return moved
