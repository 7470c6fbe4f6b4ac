-- The later-wins extend of a scope's cooldown.
-- KEYS[1] = the scope's key; ARGV[1] = the new time and ARGV[2] = when the key may go
-- (both epoch ms, as decimal strings computed by the caller: no number formatting in
-- Lua). Keeps max(stored, new); a stored value that is not a number is replaced.
-- Returns the effective time. SET + PEXPIREAT (not SET PXAT) so old Redis and Valkey
-- run it. A time that moves is published on the change channel ARGV[3] (empty: none)
-- as "c <ms> <scope>", the scope being ARGV[4], *before* it is written: a writer whose
-- PUBLISH is refused (an ACL without it) writes nothing, so no near copy can miss a
-- write that the store holds.
local new = tonumber(ARGV[1])
local stored = tonumber(redis.call('GET', KEYS[1]))
if stored ~= nil and stored >= new then
  return stored
end
if ARGV[3] ~= nil and ARGV[3] ~= '' then
  redis.call('PUBLISH', ARGV[3], 'c ' .. ARGV[1] .. ' ' .. ARGV[4])
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('PEXPIREAT', KEYS[1], ARGV[2])
return new
