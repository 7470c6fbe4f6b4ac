-- A token permit answered late (weights.py, MemoryCooldownStore.settle_weighed).
-- KEYS[1] = the token quota's permits; ARGV = the answer's time (ms, rounded up), the
-- quota's per (ms), the permit's stored end (ms), its cost and a member for it should
-- it be gone: that permit (one with that end and cost; put back if it expired
-- meanwhile) counts until at least the answer + per; the key lives as long as its last
-- permit.
local new = tonumber(ARGV[1]) + tonumber(ARGV[2])
local old = tonumber(ARGV[3])
if new <= old then return 0 end
local member = ARGV[5] .. ':' .. ARGV[4]
for _, found in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], old, old)) do
  if string.match(found, ':(%d+)$') == ARGV[4] then
    member = found
    break
  end
end
redis.call('ZADD', KEYS[1], new, member)
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], tonumber(last[2]) + 1000)
return 1
