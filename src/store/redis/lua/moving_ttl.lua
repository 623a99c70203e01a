for i = 1, n do Q[i].ttl = div(Q[i].w + 999, 1000) + 1000 end
