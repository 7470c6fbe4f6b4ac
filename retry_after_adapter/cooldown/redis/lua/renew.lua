-- Renew held concurrency slots' leases (LeaseRenewal.renew).
-- KEYS[1] = the scope's lease set; ARGV[1] = now (ms, the client's clock), ARGV[2] =
-- '1' to set each end as given (earlier too), '0' to move it later only, then pairs
-- of a token and the end (ms) its lease is to have. A lease that expired or was given
-- back is not taken again: its token is returned (the tokens not held).
-- The set lives a second past its latest lease, never less than it did.
local now = tonumber(ARGV[1])
local exact = ARGV[2] == '1'
local lost = {}
local latest = 0
for i = 3, #ARGV, 2 do
  local token, ends = ARGV[i], tonumber(ARGV[i + 1])
  local stored = tonumber(redis.call('ZSCORE', KEYS[1], token))
  if stored == nil or stored <= now then
    lost[#lost + 1] = token
  else
    if ends > stored or exact then
      redis.call('ZADD', KEYS[1], ends, token)
      stored = ends
    end
    if stored > latest then latest = stored end
  end
end
if latest > 0 and redis.call('PTTL', KEYS[1]) < latest - now + 1000 then
  redis.call('PEXPIRE', KEYS[1], latest - now + 1000)
end
return lost
