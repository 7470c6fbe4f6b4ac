-- KEYS[1] = the scope's freshness hash (s = last success, e = last error class, t =
-- its time; epoch ms; k = the scope); ARGV = the outcome, its time (ms), how long (ms)
-- the record is kept after its last note, and the scope. Later news wins.
local at = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'k', ARGV[4])
if ARGV[1] == 'success' then
  local s = tonumber(redis.call('HGET', KEYS[1], 's'))
  if s == nil or at > s then redis.call('HSET', KEYS[1], 's', ARGV[2]) end
else
  local t = tonumber(redis.call('HGET', KEYS[1], 't'))
  if t == nil or at >= t then redis.call('HSET', KEYS[1], 'e', ARGV[1], 't', ARGV[2]) end
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
