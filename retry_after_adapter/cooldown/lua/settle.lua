-- KEYS[1] = a quota's permit set, KEYS[2] = its open permits; ARGV = the answer's time
-- (ms, rounded up), the quota's per (ms), the permit's stored expiry (ms), a member for
-- it should it be gone and "1" for an exact settle (an open permit's answer: its entry
-- among the open permits goes): that permit (any one with that expiry; put back if it
-- expired meanwhile) counts until at least the answer + per (exactly, earlier too, when
-- exact); the key lives as long as its last permit. (Not to be written twice: a batch's
-- open permits share their expiry, and a second write would move another one.)
local new = tonumber(ARGV[1]) + tonumber(ARGV[2])
local old = tonumber(ARGV[3])
if ARGV[5] == '1' then
  local open = redis.call('ZRANGEBYSCORE', KEYS[2], old, old, 'LIMIT', 0, 1)
  if #open > 0 then redis.call('ZREM', KEYS[2], open[1]) end
end
if new == old or (new < old and ARGV[5] ~= '1') then return 0 end
local found = redis.call('ZRANGEBYSCORE', KEYS[1], old, old, 'LIMIT', 0, 1)
local member = ARGV[4]
if #found > 0 then member = found[1] end
redis.call('ZADD', KEYS[1], new, member)
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], tonumber(last[2]) + 1000)
return 1
