-- Move open quota permits' ends later (LeaseRenewal.renew_open).
-- KEYS[1] = a quota's permit set, KEYS[2] = its open permits; ARGV[1] = now (ms, the
-- client's clock), then triples: a stored end (ms), the end (ms) to move to, and how
-- many permits at most. Up to that many permits scoring exactly that end, still
-- counting (the end after now), move to the new end (later only), and as many of the
-- open entries scoring it with them. Each key then lives a second past its last
-- member. Returns how many moved, for each triple.
local now = tonumber(ARGV[1])
local moved = {}
for i = 2, #ARGV, 3 do
  local old, new, count = tonumber(ARGV[i]), tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local found = {}
  if old > now and new > old and count > 0 then
    found = redis.call('ZRANGEBYSCORE', KEYS[1], old, old, 'LIMIT', 0, count)
    for _, member in ipairs(found) do
      redis.call('ZADD', KEYS[1], new, member)
    end
    if #found > 0 then
      local open = redis.call('ZRANGEBYSCORE', KEYS[2], old, old, 'LIMIT', 0, #found)
      for _, member in ipairs(open) do
        redis.call('ZADD', KEYS[2], new, member)
      end
    end
  end
  moved[#moved + 1] = #found
end
for k = 1, 2 do
  local last = redis.call('ZRANGE', KEYS[k], -1, -1, 'WITHSCORES')
  if #last > 0 then redis.call('PEXPIREAT', KEYS[k], tonumber(last[2]) + 1000) end
end
return moved
