    -- The end of lua/decide.lua's loops, after the algorithms' blocks.
    if not write then
      if out[b] == nil then return redis.error_reply('unknown algorithm ' .. tostring(alg)) end
      if not out[b] and argv[a + 3] ~= '1' then allowed = false end
    end
  end
end
out[1] = allowed and 1 or 0
-- Redis's clock, then the end of the reply (the first nil: past it, what
-- is left of the state).
out[o + 1] = now
out[o + 2] = nil
return out
