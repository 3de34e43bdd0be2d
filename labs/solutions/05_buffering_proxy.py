# Solution · lab 05 · a proxy in the way
#
# The same llama-cpp-python server, measured directly and through two
# reverse proxies on this machine, 6 requests of 64 + 32 tokens at 0.5
# requests/s. A token is stamped when the network read that carries it
# arrives, so the client sees what the proxy lets through:
#
# * Held whole (nginx's proxy_buffering, its default, on a short answer):
#   nothing arrives until the answer ends, so TTFT is the whole answer's
#   time (TTFT = e2e) and every token has one timestamp. The decode is
#   hidden inside TTFT. The lab gives these requests no TPOT (NaN, not 0)
#   and counts them (decode_unseen_requests 6 of 6); lablib bench and the
#   panel say so in a sentence. A dashboard of TTFT alone would blame the
#   engine's prefill for what is the decode of 32 tokens.
# * In 4 KiB pieces (nginx's buffers): the first piece leaves once the
#   server's chunks have filled it, so the first token arrives with the
#   ones decoded after it, TTFT holds their decode, and the rest come in
#   bursts. Worse than the first case in a way: every request has a TPOT,
#   yet it comes out at less than half the server's real one (the
#   first-to-last span is shorter than the decode). The lab counts these
#   requests too (first_bunched_requests 6 of 6: each row's
#   first_arrival_tokens, the tokens that came with the first, is above 1),
#   and lablib bench and the panel say what it means.
#
# So: measure the server itself, or a path you know streams (nginx:
# proxy_buffering off, or the X-Accel-Buffering: no header from the
# server); a TPOT much lower than the engine's own, with a TTFT much higher,
# says something between them buffers.
#
# What it printed on the 2-core machine the lab was written on (about
# 1 minute, while other tests ran: the direct TTFT of 1 s is a busy
# machine's prefill of 64 tokens on one thread; three runs gave the direct
# TPOT 0.017-0.018 s, through 4 KiB pieces 0.007-0.010 s):
#                                               server  ttft_p50_s  tpot_p50_s  e2e_p50_s  decode_unseen_requests  first_bunched_requests
#                                     llama-cpp-python       1.072       0.017      1.617                       0                       0
#      llama-cpp-python behind a proxy (whole answers)       1.325         NaN      1.325                       6                       0
#   llama-cpp-python behind a proxy (4096-byte pieces)       1.087       0.007      1.288                       0                       6
import lablib
from lablib.engines.servers import start_buffering_proxy, start_server
from lablib.studies import serving

model = lablib.prepare()
servers = [start_server("llama-cpp-python", model, threads=1)]
try:
    # the same server twice more, behind a proxy: one that holds each answer whole (nginx's proxy_buffering on a
    # short answer), one that sends it on in 4 KiB pieces (nginx's buffers)
    servers += [start_buffering_proxy(servers[0]), start_buffering_proxy(servers[0], chunk_bytes=4096)]
    table = serving.rate_sweep_table(
        servers, model, [0.5], requests=6, prompt_tokens=64, max_new_tokens=32, ttft_s=1.0, tpot_s=0.1
    )
    cols = ["server", "ttft_p50_s", "tpot_p50_s", "e2e_p50_s", "decode_unseen_requests", "first_bunched_requests"]
    print(table[cols].round(3).to_string(index=False))
finally:
    for s in reversed(servers):  # the proxies first, then the server behind them
        s.stop()
