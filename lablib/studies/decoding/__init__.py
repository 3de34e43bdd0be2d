"""Lab 10's subjects: decoding tricks that change decode speed or what may be said without changing the
model. :mod:`.speculative` (a draft proposes tokens, the target verifies them in one pass) and
:mod:`.structured` (a grammar masks the tokens a schema forbids at each step)."""
